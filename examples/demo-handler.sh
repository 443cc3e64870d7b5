#!/bin/sh
# The demo's handler for `bq-dedupe run --exec`: reads the envelope on stdin and
# "processes" it. The third order fails on its first attempt, to show a failed
# handler leaving its id unmarked so the retry runs.
envelope=$(cat)
marker=.bq-dedupe/demo-failed-once
case "$envelope" in
  *00000003-b5a6-4789-90ab-cdef01234567*)
    if [ ! -e "$marker" ]; then
      mkdir -p .bq-dedupe && touch "$marker"
      echo "payment gateway timeout" >&2
      exit 1
    fi
    ;;
esac
exit 0
