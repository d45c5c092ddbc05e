# The twin image: the static doppel binary and nothing else. Built locally, no registry (task twin-image):
#   CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/image/doppel ./cmd/doppel
#   docker build -f docker/twin.Dockerfile -t doppel-twin:dev bin/image
# The Docker driver copies the bundle to /bundle.json before the container starts and runs
#   /doppel twin --listen 0.0.0.0:7070 --bundle /bundle.json
FROM scratch
COPY doppel /doppel
USER 65534:65534
EXPOSE 7070
ENTRYPOINT ["/doppel"]
CMD ["twin", "--listen", "0.0.0.0:7070", "--bundle", "/bundle.json"]
