#!/bin/sh
# The image's entrypoint. `controller ARGS` and `broker ARGS` run that server
# (`python -m controller|broker ARGS`); arguments that start with `-` are broker flags;
# anything else runs as given (`python -c ...`, `minibroker topic list`, `bash`).
# exec: the server replaces this shell (it is PID 1, or docker-init's child with --init)
# and receives `docker stop`'s SIGTERM itself.
set -eu
case "${1:-}" in
controller | broker) exec python -m "$@" ;;
-*) exec python -m broker "$@" ;;
esac
exec "$@"
