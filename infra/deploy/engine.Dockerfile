# syntax=docker/dockerfile:1
# The engine: vLLM's OpenAI-compatible server with the vllm-lens plugin (activation capture and steering
# through vllm_xargs; ../shared/ENGINE.md). The plugin registers itself with vLLM on install.
#   docker build -f infra/deploy/engine.Dockerfile -t svc-engine infra/deploy
# VLLM_IMAGE: a vLLM release vllm-lens supports (vllm-lens needs vllm >= 0.16 and Python 3.12; its
# docs/compatibility.md names the release it validates against). Pin both in production.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.30.0
FROM ${VLLM_IMAGE}
ARG VLLM_LENS_VERSION=
# vLLM is held at the image's version: a vllm-lens that wants another fails the build instead of
# silently replacing the engine. vLLM's images install with uv where they have it, pip otherwise.
RUN set -eu; \
    vllm_pin="vllm==$(python3 -c 'import vllm; print(vllm.__version__)')"; \
    lens="vllm-lens${VLLM_LENS_VERSION:+==${VLLM_LENS_VERSION}}"; \
    if command -v uv >/dev/null 2>&1; then uv pip install --system --no-cache "$lens" "$vllm_pin"; \
    else python3 -m pip install --no-cache-dir "$lens" "$vllm_pin"; fi; \
    python3 -c 'import vllm_lens'
# A vllm-lens whose HTTP integration cannot install itself stops the server at start instead of
# serving completions that silently drop captures.
ENV VLLM_LENS_STRICT_COMPATIBILITY=1
ENTRYPOINT ["vllm", "serve"]
