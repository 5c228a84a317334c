# GPU image for compose.yaml: vLLM's CUDA build plus rstar. Build: docker compose build
# (ROCm / MI300X: set BASE_IMAGE to a vLLM ROCm image, e.g. with `--build-arg BASE_IMAGE=...`.)
ARG BASE_IMAGE=vllm/vllm-openai:latest
FROM ${BASE_IMAGE}

RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/rstar
COPY . .
# vLLM is already in the base image; install rstar with Ray and the PostgreSQL driver on top of it, then the
# graders' pieces pip does not install (bfcl-eval's checkers, NLTK's punkt tables).
RUN pip install --no-cache-dir -e ".[ray,postgres]" && bash install_graders.sh python3
ENTRYPOINT ["rstar"]
