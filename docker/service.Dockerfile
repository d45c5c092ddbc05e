# The service image: `doppel serve` (the API), `doppel worker` (the Temporal worker) and `doppel migrate`, on
# PostgreSQL, S3 (MinIO) and a Temporal server. Built locally, no registry (task service-image):
#   docker/service-image.sh [TAG]      # default doppel-service:dev
# which puts into a fresh build context the static binary (CGO_ENABLED=0 go build -trimpath -ldflags "-s -w"
# ./cmd/doppel), the host's CA bundle (TLS to S3, OTLP, a model API and webhook receivers) and two empty
# directories, data/ and tmp/, that become /data (data_dir: process twins' state when twin.driver=process) and
# /tmp (request bodies and bundles spooled to disk), both owned by the image's user. FROM scratch: nothing else
# is in the image, so it needs no base image pulled from a registry.
FROM scratch
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --chown=65534:65534 data /data
COPY --chown=65534:65534 tmp /tmp
COPY doppel /doppel
USER 65534:65534
# In a container the API and the worker's metrics listen on every interface (the defaults are loopback).
ENV DOPPEL_DATA_DIR=/data \
    DOPPEL_API_ADDR=0.0.0.0:8080 \
    DOPPEL_METRICS_WORKER_ADDR=0.0.0.0:9464 \
    TMPDIR=/tmp
EXPOSE 8080 9464
ENTRYPOINT ["/doppel"]
CMD ["serve"]
