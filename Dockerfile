# agent-bridge container image (docs/deploy.md "Container image").
#
#   docker build -t agent-bridge .
#   docker build -t agent-bridge --build-arg AGENT_CLIS="@anthropic-ai/claude-code" .
#   podman build --format docker -t agent-bridge .   # podman: docker format keeps HEALTHCHECK
#
# Build arguments:
#   BASE_IMAGE  a Debian bookworm (or later) image; Python, tini and, with AGENT_CLIS,
#               Node.js come from its Debian packages. A base that already has `node` on
#               PATH (e.g. node:22-bookworm-slim) keeps its own Node.js.
#   AGENT_CLIS  npm packages installed globally (space-separated, e.g.
#               "@anthropic-ai/claude-code@2.1.197 @qwen-code/qwen-code"); empty: none,
#               only the bundled demo agent.
#   EXTRAS      the package's extras installed with it (e.g. "cluster": psycopg and
#               redis-py, for replicas on a shared PostgreSQL store and Redis bus; see
#               deploy/compose/compose.scale.yaml); empty: none, the SQLite daemon.
#
# Runtime: uid/gid 10001, HOME=/home/agent-bridge and AGENT_BRIDGE_DATA_DIR=/data are
# volumes (agent CLIs keep their session files under HOME, which --resume needs), and
# /workspaces is there to mount project checkouts into. Listens on 0.0.0.0:8765 with the
# token from AGENT_BRIDGE_TOKEN, else /data/token (generated on first start; the log says
# how to read it). Agents get none of the container's environment beyond a small
# allowlist: give them keys by logging the CLI in once (kept in HOME) or in a profile's
# env in a mounted config file (docs/deploy.md "Agent CLIs and their keys").

ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

# ---------------------------------------------------------------- python: shared by all stages
FROM ${BASE_IMAGE} AS python
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Versions follow the base image's Debian release; pinning them here would break every
# other base image the argument allows.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates python3 \
 && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------- tools: venv + pip
FROM python AS tools
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/pip
# pip trusts the system store (where an operator adds a proxy's CA), not only its own bundle.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# ---------------------------------------------------------------- build: the wheel
FROM tools AS build
WORKDIR /src
# .dockerignore lets in only the package sources.
COPY . .
RUN /opt/pip/bin/pip wheel --no-deps --wheel-dir /dist .

# ---------------------------------------------------------------- runtime
FROM python AS runtime
ARG AGENT_CLIS=""
ARG EXTRAS=""
# tini is PID 1: it reaps the zombies agents' process trees leave and passes SIGTERM on.
# hadolint ignore=DL3008,DL3016,SC2086
RUN apt-get update \
 && extra="" \
 && if [ -n "${AGENT_CLIS}" ] && ! command -v node >/dev/null; then extra="nodejs npm"; fi \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tini git $extra \
 && rm -rf /var/lib/apt/lists/* \
 && if [ -n "${AGENT_CLIS}" ]; then \
      npm install --global --no-audit --no-fund --loglevel=error ${AGENT_CLIS} \
      && npm cache clean --force; \
    fi \
 && groupadd --gid 10001 agent-bridge \
 && useradd --uid 10001 --gid 10001 --home-dir /home/agent-bridge --create-home --shell /bin/bash agent-bridge \
 && install -d -o 10001 -g 10001 -m 0700 /data \
 && install -d -o 10001 -g 10001 -m 0755 /workspaces

# The wheel installed into a venv of its own by the build stage's pip, which is mounted,
# never copied: the image ships no installer. (The COPY also orders this stage after the
# build stage, which a RUN --mount alone does not do in every builder.) A change of the
# sources rebuilds these two layers and the metadata below, nothing else.
COPY --from=build /dist/ /tmp/dist/
RUN --mount=type=bind,from=build,source=/opt/pip,target=/opt/pip \
    python3 -m venv --without-pip /opt/agent-bridge \
 && wheel="$(echo /tmp/dist/*.whl)" \
 && PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    /opt/pip/bin/python -m pip --python /opt/agent-bridge/bin/python install "${wheel}${EXTRAS:+[${EXTRAS}]}" \
 && rm -rf /tmp/dist \
 && /opt/agent-bridge/bin/agent-bridge --version

ENV PATH=/opt/agent-bridge/bin:$PATH \
    HOME=/home/agent-bridge \
    AGENT_BRIDGE_HOST=0.0.0.0 \
    AGENT_BRIDGE_PORT=8765 \
    AGENT_BRIDGE_DATA_DIR=/data \
    PYTHONDONTWRITEBYTECODE=1

USER 10001:10001
WORKDIR /workspaces
VOLUME ["/data", "/home/agent-bridge"]
EXPOSE 8765

# No curl in the image: the image's own Python asks /healthz (no auth needed) on loopback.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('AGENT_BRIDGE_PORT', '8765'), timeout=4)"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "agent-bridge"]
CMD ["serve"]
