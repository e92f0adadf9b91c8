#!/bin/bash
# The cluster scenario's request loop (verify.yml): one chat completion through the router
# every 0.2 s until DIR/stop exists, then DIR/done. Each request appends a line to
# DIR/requests.txt: "<unix time it was sent> <HTTP status>" (000: no answer within 20 s).
#
#   request_loop.sh DIR ROUTER_URL CA_FILE      (the API key is read from DIR/key)
set -u
dir="$1" url="$2" ca="$3"
key="$(cat "$dir/key")"
body='{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
while [ ! -e "$dir/stop" ]; do
  sent="$(date +%s.%N)"
  code="$(curl -s -o /dev/null --max-time 20 -w '%{http_code}' --cacert "$ca" \
    -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d "$body" "$url/v1/chat/completions")"
  echo "$sent ${code:-000}" >> "$dir/requests.txt"
  sleep 0.2
done
touch "$dir/done"
