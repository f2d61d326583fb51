FROM python:3.11-slim
WORKDIR /app
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY streamgnn ./streamgnn
# core and the REST API (the compose file serves it); add mpi for serve --workers
RUN pip install --no-cache-dir '.[rest]'
ENTRYPOINT []
