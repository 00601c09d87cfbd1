#!/usr/bin/env bash
# The README's run command before the development scripts moved to scripts/ (issue 69): kept so that
# instructions written before the move keep working.
exec "$(dirname "$0")/../scripts/run.sh" "$@"
