#!/bin/bash
# The cluster scenario's request loop (verify.yml): one chat completion through the router
# every 0.2 s until DIR/stop exists, then DIR/done; every other one streamed. Each request
# appends a line to DIR/requests.txt: "<unix time it was sent> <outcome>", the outcome its
# HTTP status (000: no answer within 20 s), or "cut" for a 200 that is not a whole answer:
# a stream that did not end with "data: [DONE]" (a replica stopped under it), or a plain
# answer without a chat.completion.
#
#   request_loop.sh DIR ROUTER_URL CA_FILE      (the API key is read from DIR/key)
set -u
dir="$1" url="$2" ca="$3"
key="$(cat "$dir/key")"
n=0
while [ ! -e "$dir/stop" ]; do
  n=$((n + 1))
  if [ $((n % 2)) -eq 0 ]; then stream=true max=16; else stream=false max=4; fi
  body='{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":'$max
  body="$body"',"stream":'$stream'}'
  sent="$(date +%s.%N)"
  rm -f "$dir/answer"
  code="$(curl -s -o "$dir/answer" --max-time 20 -w '%{http_code}' --cacert "$ca" \
    -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d "$body" "$url/v1/chat/completions")"
  if [ "$code" = 200 ]; then
    if [ "$stream" = true ]; then
      grep -q '^data: \[DONE\]' "$dir/answer" || code=cut
    else
      grep -q '"chat.completion"' "$dir/answer" || code=cut
    fi
  fi
  echo "$sent ${code:-000}" >> "$dir/requests.txt"
  sleep 0.2
done
touch "$dir/done"
