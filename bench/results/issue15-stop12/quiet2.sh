#!/bin/bash
# usage: quiet2.sh <command...> — keep every other python/pytest process stopped while the command runs.
# One at a time: a second quiet2 waits for the first (two watchers would stop each other's processes: deadlock).
exec 9>/tmp/quiet2.lock
flock 9
me=$$
stopped=/tmp/quiet2.$$; : > $stopped
is_mine() { local p=$1; while [ "$p" -gt 1 ]; do [ "$p" = "$me" ] && return 0; p=$(ps -o ppid= -p $p 2>/dev/null | tr -d ' '); [ -z "$p" ] && return 1; done; return 1; }
( while true; do for p in $(pgrep -f 'python|pytest'); do is_mine $p || { kill -STOP $p 2>/dev/null && echo $p >> $stopped; }; done; sleep 0.5; done ) &
watcher=$!
trap 'kill $watcher 2>/dev/null; sort -u $stopped | xargs -r kill -CONT 2>/dev/null; rm -f $stopped' EXIT
sleep 0.5
"$@"
