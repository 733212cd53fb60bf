# The bot in a container: `docker compose up` with compose.yaml beside this file, or
#   docker build -t turn-engine . && docker run --env-file .env \
#     -v turn-journals:/data/journals turn-engine
# Settings come from TURN_* variables (the .env file) and, when one is mounted there (add
# -v "$PWD/turn.toml:/config/turn.toml:ro" once the file exists), /config/turn.toml: the
# working directory is /config, where the bot looks for turn.toml. See .env.example and
# docs/configuration.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/turn-engine
COPY pyproject.toml README.md LICENSE ./
COPY fsm ./fsm
COPY providers ./providers
COPY discord_io ./discord_io
COPY turn_engine ./turn_engine
RUN pip install . && useradd --system --uid 10001 --home-dir /data turn \
    && mkdir -p /data/journals /config && chown -R turn /data

USER turn
WORKDIR /config
ENV TURN_JOURNALS__DIR=/data/journals
VOLUME ["/data"]
# SIGTERM is the bot's graceful shutdown: running turns are stopped keeping what they
# delivered, journals are flushed, the gateway is closed.
STOPSIGNAL SIGTERM
ENTRYPOINT ["turn-engine"]
CMD ["bot"]
