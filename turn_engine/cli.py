"""`turn-engine`, the operator's one command: the main job (`bot`, `chat`, `demo`, or no
subcommand to choose by what is configured) and the engine's scenario and review tools
(`run-scenario`, `replay`, `diagram`, `inspect`, `review`), which are `python -m fsm`'s."""

from __future__ import annotations

import sys

MAIN_JOB = ("bot", "chat", "demo")
USAGE = """usage: turn-engine [bot | chat | demo]
       turn-engine {run-scenario,replay,diagram,inspect,review} ...

With no subcommand: the Discord bot when TURN_DISCORD_TOKEN and a provider are configured,
the terminal chat when only a provider is, otherwise the built-in demo turns."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if not args or args[0] in MAIN_JOB:
        if len(args) > 1:
            print(f"error: turn-engine {args[0]} takes no arguments (settings come from "
                  "TURN_* variables and the config file)", file=sys.stderr)
            return 2
        from .__main__ import main as main_job

        return main_job(args[0] if args else "auto")
    from fsm.cli import main as engine_tools

    return engine_tools(args)


if __name__ == "__main__":
    sys.exit(main())
