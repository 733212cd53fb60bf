"""The operator's side as the settings describe it: the models /model may choose, the
personas, the tool catalog (built-ins, Python hooks, MCP servers) and the store. Built once
at start-up (`build_bot`) and, for what may change without a restart, again on reload."""

from __future__ import annotations

import aiohttp

from fsm import Attempt, Tool
from providers import ProviderConfig, build_provider

from .operator_side import DEFAULT, OperatorConfig, OperatorSide
from .persona import Persona
from .persona_library import load_personas
from .settings import AppSettings
from .settings_store import SettingsStore, StoreError
from .startup import StartupError
from .stores import build_store
from .tool_catalog import ToolCatalog
from .tool_hooks import load_hook_tools


def label_of(config: ProviderConfig) -> str:
    return f"{config.kind}:{config.model}"


def model_attempts(settings: AppSettings,
                   session: aiohttp.ClientSession) -> dict[str, list[Attempt]]:
    """`default` -> the provider and fallbacks; each named model -> it, then the fallbacks."""
    fallbacks = [Attempt(build_provider(c, session), label_of(c)) for c in settings.fallbacks]
    models: dict[str, list[Attempt]] = {}
    if settings.provider is not None:
        models[DEFAULT] = [Attempt(build_provider(settings.provider, session),
                                   label_of(settings.provider)), *fallbacks]
    for name, config in settings.models.items():
        models[name] = [Attempt(build_provider(config, session), label_of(config)), *fallbacks]
    return models


def operator_config(settings: AppSettings, session: aiohttp.ClientSession,
                    persona: Persona) -> OperatorConfig:
    """What a reload replaces; raises `ConfigurationError` for a broken persona file."""
    return OperatorConfig(models=model_attempts(settings, session),
                          personas=load_personas(settings.personas),
                          default_prompt=persona.system_prompt, manage=settings.manage,
                          usage=settings.usage)


def build_catalog(settings: AppSettings, builtins: list[Tool]) -> ToolCatalog:
    """The tools: built-ins, the hooks' (imported once; a broken hook stops start-up), the
    MCP servers' (started with the bot)."""
    catalog = ToolCatalog(builtins, load_hook_tools(settings.tool_hooks),
                          log_dir=settings.data_dir)
    catalog.configure(settings.mcp_servers)
    return catalog


def build_operator(settings: AppSettings, session: aiohttp.ClientSession, persona: Persona,
                   catalog: ToolCatalog, store: SettingsStore) -> OperatorSide:
    return OperatorSide(operator_config(settings, session, persona), store, catalog)


async def open_store(settings: AppSettings) -> SettingsStore:
    """The settings store, created or migrated and proven writable; one line if it cannot be
    (a corrupt, locked or read-only file, an unreachable Redis)."""
    try:
        store = build_store(settings)
    except StoreError as exc:
        raise StartupError(str(exc)) from None
    try:
        await store.open()
    except StoreError as exc:
        await store.aclose()
        raise StartupError(str(exc)) from None
    return store
