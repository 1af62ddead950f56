#!/bin/sh
# A stand-in provider for trying agent profiles without Codex or Claude:
#   squadron worker --provider-script codex=examples/agent-provider.sh \
#                   --provider-script claude=examples/agent-provider.sh …
# It shows what it was given, leaves a capsule on SIGTERM (what a graceful takeover commits),
# and writes one line to its worktree every few seconds until stopped.
echo "provider $SQUADRON_PROVIDER, profile $SQUADRON_PROFILE_ID, generation $SQUADRON_GENERATION"
[ -f /mnt/run/capsule.json ] && { echo "resumed from:"; cat /mnt/run/capsule.json; echo; }
trap 'printf "{\"task_state\":\"stopped by %s in generation %s\",\"pending_work\":[\"carry on\"]}" \
  "$SQUADRON_PROVIDER" "$SQUADRON_GENERATION" > /state/capsule.json; exit 0' TERM
while :; do
  date >> /workspace/agent-notes.txt
  sleep 3
done
