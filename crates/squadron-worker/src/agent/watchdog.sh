#!/bin/sh
# Squadron self-fencing watchdog: the provider may run only while the lease is renewed.
# An asynchronous command gets /dev/null as stdin unless redirected: pass ours (the prompt).
exec 3<&0
"$@" <&3 3<&- &
child=$!
exec 3<&-
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
while kill -0 "$child" 2>/dev/null; do
  deadline=$(cat /mnt/run/lease-deadline-ms 2>/dev/null || echo 0)
  now=$(date +%s%3N)
  # Fails closed: a deadline or clock that is not a number stops the provider too.
  if ! [ "$now" -le "$deadline" ] 2>/dev/null; then
    echo "squadron: the lease was not renewed before $deadline; stopping the provider" >&2
    kill -KILL "$child" 2>/dev/null
    break
  fi
  sleep 0.2
done
wait "$child"
