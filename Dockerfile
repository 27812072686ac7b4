# One image for every TAO process; pick the role with the command, e.g.
#   docker run tao tao serve planner --host 0.0.0.0 --port 50052 --redis-url redis://redis:6379/0
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY services ./services
COPY tao ./tao
COPY protos ./protos
# the runtime dependencies only (benchmarks, bench/, are not part of the package): no `report` (matplotlib, rich) or `faults` (hypothesis) extra
RUN pip install --no-cache-dir . && useradd --system --uid 10001 tao
USER tao
# gRPC: router admin 50051, planner 50052, predictor 50053, budget 50054; router HTTP 8080
EXPOSE 8080 50051 50052 50053 50054
ENTRYPOINT []
CMD ["tao", "--help"]
