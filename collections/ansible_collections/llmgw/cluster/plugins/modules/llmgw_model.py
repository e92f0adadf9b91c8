#!/usr/bin/python
# Copyright: llmgw maintainers

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llmgw_model
short_description: Declare one model of an llmgw catalog
version_added: "0.1.0"
description:
  - Creates, updates or deletes one entry of the catalog of an llmgw control service
    through its admin API.
  - O(state=present) reads the model (C(GET /api/v1/models/<name>)), compares the declared
    fields with the stored definition, and only when they differ sends
    C(PUT /api/v1/catalog) with a catalog that holds just this model. That call upserts; it
    never deletes other models.
  - "The comparison is made in the form the server stores. The fields left out take the
    server's defaults, which each option names (the O(autoscale) settings' defaults for a
    model that scales; no O(args), O(aliases), O(fallback), O(max_tokens) or O(rollout)).
    A O(replicas) range is compared as the stored C(replicas) (its min), C(replicas_max)
    and C(on_demand); durations are compared in seconds (O(drain_timeout_s) C(2m) equals a
    stored C(120.0)); a O(max_tokens) or O(rollout) mapping with every setting, its
    defaults filled in. A task run twice reports no change the second time."
  - The fields and their rules are the catalog's (C(docs/catalog.md) of the llmgw
    repository); the module types them and the server validates them.
  - O(state=absent) sends C(DELETE /api/v1/models/<name>) when the model exists.
  - The server validates the entry; a refused entry fails the task with the server's
    message and every problem it lists. The admin API is described in C(docs/api.md) of
    the llmgw repository.
  - Fields not given take the server's defaults, not the values stored now; declare the
    whole entry.
author:
  - llmgw maintainers
attributes:
  check_mode:
    support: full
    description: Reports what would change; sends no C(PUT) or C(DELETE).
  diff_mode:
    support: full
    description: Shows the model's compared fields before and after.
notes:
  - "The module talks HTTP(S) to the control service from the host it runs on; run it on
    the controller (C(delegate_to: localhost), C(run_once: true)) or on a host that can
    reach the control service."
  - In check mode an entry the server would refuse is still reported as a change; only
    a real run lets the server validate it.
  - A declaration the server would refuse (for example O(on_demand=false) with a range
    whose min is 0) is never taken as equal to the stored model; it is sent, and the task
    fails with the server's message.
options:
  control_url:
    description:
      - Base URL of the control service, for example C(https://ctl1.example.net:8470).
      - When not given, the environment variable E(LLMGW_CONTROL_URL) of the host the
        module runs on.
    type: str
    required: true
  token:
    description:
      - The admin token (C(llmgw-admin-...)).
      - When not given, the environment variable E(LLMGW_ADMIN_TOKEN).
    type: str
    required: true
  ca_path:
    description:
      - PEM file of the CA that signed the control service's certificate, for C(https).
      - When not given, the environment variable E(LLMGW_CA_FILE), else the system's CAs.
    type: path
  validate_certs:
    description:
      - Verify the control service's TLS certificate. Turn off only for tests.
    type: bool
    default: true
  timeout:
    description: Seconds to wait for each answer of the control service.
    type: int
    default: 30
  name:
    description:
      - "The model's name, as clients write it in C(model). Letters, digits and
        C(. _ - : @ + /)."
    type: str
    required: true
  state:
    description: Whether the model is in the catalog.
    type: str
    choices: [present, absent]
    default: present
  source:
    description:
      - Where the weights are, C(file:///PATH), an absolute path, C(hf://ORG/REPO/FILE) or
        C(https://URL).
      - Required when O(state=present).
    type: str
  engine:
    description:
      - The engine that serves the model, C(llama.cpp) or C(vllm) (the server decides
        which engines it knows).
      - Required when O(state=present).
    type: str
  profile:
    description:
      - What one replica needs. Required when O(state=present).
    type: dict
    suboptions:
      class:
        description:
          - Device class, for example C(h100-80g), C(a100-80g-mig-3g.40gb) or C(cpu).
        type: str
        required: true
      gpus:
        description: Devices per node. The server's default is 1.
        type: int
      tp:
        description: Tensor-parallel size. The server's default is 1.
        type: int
      pp:
        description: Pipeline-parallel size. The server's default is 1.
        type: int
      nodes:
        description: Nodes per replica. The server's default is 1.
        type: int
      memory_gb:
        description: Device memory one replica needs, in GB.
        type: float
  replicas:
    description:
      - How many replicas to run, as a whole number or as a range.
      - "A number N keeps N running (min = max = N); 0 keeps the model in the catalog
        with nothing running. The server's default is 1."
      - "A range C({min: M, max: N}) (each 0 to 256, M at most N) lets the control service
        scale the model between M and N on the routers' load, as O(autoscale) says.
        C(min: 0) is on demand: no replica until the first request, as O(on_demand=true).
        C({min: 2, max: 2}) is the same as C(2)."
      - The server stores the min as C(replicas) and the max as C(replicas_max) (null
        when fixed). A string of digits, such as a templated value, is read as a number.
      - A range is accepted since 0.2.0; before, only a whole number.
    type: raw
  on_demand:
    description:
      - Start no replica until the first request for the model, which starts O(replicas)
        of them. The server's default is false.
      - "With a range, C(min: 0) is on demand already; O(on_demand=true) with a min above
        0, or O(on_demand=false) with a min of 0, is refused."
    type: bool
  idle_stop_after:
    description:
      - "For an on-demand model (O(on_demand=true) or a O(replicas) range with C(min: 0)),
        stop its replicas after this long without a request, for example C(30m), C(1h),
        C(90s) or a number of seconds."
      - The server stores it as seconds (C(idle_stop_after_s)); C(30m) and C(1800) are the
        same value.
    type: raw
  autoscale:
    description:
      - "How the control service scales a model whose O(replicas) range leaves it room to
        grow, like C({min: 1, max: 4}); refused on any other model (a number,
        C({min: 0, max: 1}))."
      - Every setting is optional and takes the server's default when left out. A duration
        is a number of seconds or C(90s), C(2m), C(1h) (above 0, at most a day;
        O(autoscale.wait_target_s) at most 3600); the server stores all of them in
        seconds, so C(2m) and a stored C(120.0) are the same.
      - Autoscaling is described in C(docs/autoscaling.md) of the llmgw repository.
    type: dict
    version_added: "0.2.0"
    suboptions:
      wait_target_s:
        description:
          - A replica is added when requests wait longer than this for a slot (the 90th
            percentile) for O(autoscale.up_after_s). Must be below O(max_wait_s).
          - The server's default is 2 seconds.
        type: raw
      up_after_s:
        description:
          - How long requests must wait longer than O(autoscale.wait_target_s) (or be
            refused for capacity), without a break, before a replica is added.
          - The server's default is 30 seconds.
        type: raw
      busy_below:
        description:
          - A replica is removed when under this share of the ready replicas' slots is
            busy, with nothing waiting, for O(autoscale.down_after_s); between 0 and 1
            (exclusive).
          - The server's default is 0.3.
        type: float
      down_after_s:
        description:
          - How long the replicas must stay under O(autoscale.busy_below), without a break,
            before one is removed.
          - The server's default is 300 seconds.
        type: raw
      cooldown_s:
        description:
          - At least this long between two steps, up or down.
          - The server's default is 60 seconds.
        type: raw
  args:
    description:
      - Extra engine arguments, for example C(["--ctx-size", "8192"]). Flags the agent
        owns (host, port, model path, ...) are refused.
    type: list
    elements: str
  strategy:
    description:
      - Where the replicas go, C(binpack) (fill busy nodes first) or C(spread) (replicas on
        different nodes). The server's default is C(binpack).
    type: str
    version_added: "0.2.0"
  sha256:
    description:
      - For an C(https://) or C(file://) source, the weights' SHA-256 (64 hexadecimal
        digits, C(sha256sum)'s output), checked after a download. Compared in lower case.
    type: str
    version_added: "0.2.0"
  size_bytes:
    description:
      - For an C(https://) or C(file://) source, the weights' size in bytes, checked after
        a download.
    type: int
    version_added: "0.2.0"
  routing:
    description:
      - How a router picks among the replicas with a free slot, C(prefix-affinity)
        (requests that share a prompt prefix go to the replica that has it cached) or
        C(least-outstanding) (the replica with the fewest requests in flight). The
        server's default is C(prefix-affinity).
    type: str
    version_added: "0.2.0"
  slots:
    description:
      - Requests one replica serves at once, 1 to 4096; the agent launches the engine with
        it (llama.cpp C(--parallel), vLLM C(--max-num-seqs)). Args that set that flag to
        another number are refused.
      - When not given, what the args set, else the engine's default.
    type: int
    version_added: "0.2.0"
  max_queue:
    description:
      - Requests that may wait for a free slot, per model in each router (0 to 100000);
        one more is refused at once with HTTP 429. 0 is no queue. The server's default is
        100.
    type: int
    version_added: "0.2.0"
  max_wait_s:
    description:
      - Seconds a request may wait for a slot (above 0, at most 3600); then it is refused
        with HTTP 429. The server's default is 30.
    type: float
    version_added: "0.2.0"
  aliases:
    description:
      - Other names clients may put in C(model) for this model (at most 16, the same
        characters as O(name)), for example C([gpt-4o-mini]).
      - An alias names one model only; an alias that is another model's name or alias is
        refused.
    type: list
    elements: str
    version_added: "0.2.0"
  fallback:
    description:
      - Models this model's requests go to, in order, when it is parked, unplaceable or at
        capacity (at most 8; each a model of the catalog, not this one). Their own
        fallbacks are not followed.
    type: list
    elements: str
    version_added: "0.2.0"
  max_tokens:
    description:
      - "The model's cap on the tokens one answer may generate, C({default: N, max: M,
        clamp: false}); every setting is optional. Not set, requests reach the engine as
        they are."
      - A chat or text completion request that sets no C(max_tokens) (nor, for chat,
        C(max_completion_tokens)) gets O(max_tokens.default); one that asks for more than
        O(max_tokens.max) is refused with HTTP 400 naming the cap, or lowered to it with
        O(max_tokens.clamp=true). Embeddings, C(/v1/responses) and C(/v1/messages) pass as
        they are (C(docs/routing.md) of the llmgw repository).
      - "Compared with every setting filled in, so C({max: 4096}) and a stored
        C({default: null, max: 4096, clamp: false}) are the same. C(docs/catalog.md) of the
        llmgw repository describes it."
    type: dict
    version_added: "0.3.0"
    suboptions:
      default:
        description:
          - The tokens a request that does not say gets, 1 to 10000000; at most
            O(max_tokens.max) when both are set.
          - When not given, none (the engine's own default).
        type: int
      max:
        description:
          - The most tokens a request may ask for, 1 to 10000000.
          - When not given, no cap.
        type: int
      clamp:
        description:
          - Lower a request above O(max_tokens.max) to it instead of refusing it with
            HTTP 400.
          - The server's default is false.
        type: bool
  rollout:
    description:
      - "How a change of the model's definition (O(source), O(sha256), O(size_bytes),
        O(engine), O(profile), O(args), O(slots)) replaces its running replicas,
        C({max_surge: 1, max_unavailable: 0, canary_percent: 0}); every setting is
        optional. Not set, the control service rolls with those defaults."
      - A rollout starts a new replica, waits until it is ready, drains an old one (its
        requests in flight finish, see O(drain_timeout_s)) and repeats; a new version that
        fails to start stops the rollout and the old replicas keep serving.
      - "Compared with every setting filled in, so C({max_unavailable: 1}) and a stored
        C({max_surge: 1, max_unavailable: 1, canary_percent: 0}) are the same.
        C(docs/operations.md) of the llmgw repository describes rollouts."
    type: dict
    version_added: "0.4.0"
    suboptions:
      max_surge:
        description:
          - New replicas started beside the old ones before an old one drains.
          - O(rollout.max_surge) and O(rollout.max_unavailable) may not both be 0.
          - The server's default is 1.
        type: int
      max_unavailable:
        description:
          - Old replicas that may drain before their replacement is ready; 1 for a fleet
            with no room to start one more replica beside the old ones.
          - The server's default is 0.
        type: int
      canary_percent:
        description:
          - "0: replace every replica. 1 to 99: run one new replica beside the old ones
            with that share of the model's requests until C(llmgw ctl rollout promote),
            or until its error rate rolls it back."
          - The server's default is 0.
        type: int
  drain_timeout_s:
    description:
      - "How long a replica that is to stop (idle stop, scale down, a lowered O(replicas),
        a rollout, a node drain, the model deleted) may finish its requests in flight; what
        still runs then is cut and counted. A number of seconds or C(90s), C(10m), C(1h)
        (above 0, at most a day)."
      - The server stores it in seconds, so C(2m) and a stored C(120.0) are the same.
      - The server's default is 120 seconds.
    type: raw
    version_added: "0.4.0"
"""

EXAMPLES = r"""
- name: Serve Qwen on one H100
  llmgw.cluster.llmgw_model:
    control_url: https://ctl1.example.net:8470
    token: "{{ llmgw_admin_token }}"
    ca_path: /etc/llmgw/ca.crt
    name: qwen2.5-7b-instruct
    source: file:///srv/models/qwen2.5-7b-instruct-q4_k_m.gguf
    engine: llama.cpp
    profile:
      class: h100-80g
      memory_gb: 9
    replicas: 2
    args: ["--ctx-size", "8192"]
  delegate_to: localhost
  run_once: true

- name: An on-demand model on a MIG slice, stopped after 30 idle minutes
  llmgw.cluster.llmgw_model:
    name: llama-3.1-8b
    source: hf://meta-llama/Llama-3.1-8B-Instruct
    engine: vllm
    profile: {class: a100-80g-mig-3g.40gb}
    on_demand: true
    idle_stop_after: 30m
  environment:
    LLMGW_CONTROL_URL: https://ctl1.example.net:8470
    LLMGW_ADMIN_TOKEN: "{{ llmgw_admin_token }}"
  delegate_to: localhost
  run_once: true

# The next tasks take the connection from LLMGW_CONTROL_URL and LLMGW_ADMIN_TOKEN in the
# environment of the host they run on (delegate_to: localhost: the controller).
- name: Chat scaled between one and four replicas on its load
  llmgw.cluster.llmgw_model:
    name: chat
    source: file:///srv/models/qwen2.5-7b-instruct-q4_k_m.gguf
    engine: llama.cpp
    profile: {class: a100-80g}
    slots: 8
    replicas: {min: 1, max: 4}
    autoscale:
      wait_target_s: 5
      up_after_s: 1m
      busy_below: 0.25
      down_after_s: 15m
      cooldown_s: 2m
    max_wait_s: 20
  delegate_to: localhost
  run_once: true

- name: On demand, up to three replicas, none after 30 idle minutes
  llmgw.cluster.llmgw_model:
    name: batch
    source: file:///srv/models/llama-3.1-8b-instruct-q4_k_m.gguf
    engine: llama.cpp
    profile: {class: a100-80g}
    replicas: {min: 0, max: 3}
    idle_stop_after: 30m
    strategy: spread
  delegate_to: localhost
  run_once: true

- name: A model clients also reach as gpt-4o-mini, falling back to chat when busy
  llmgw.cluster.llmgw_model:
    name: qwen2.5-3b-instruct
    source: https://models.example.net/qwen2.5-3b-instruct-q4_k_m.gguf
    sha256: 0f3c5cbf6c4b8a3e9f1d2c7b6a5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e
    engine: llama.cpp
    profile: {class: cpu, memory_gb: 3}
    aliases: [gpt-4o-mini, small-chat]
    fallback: [chat]
    routing: least-outstanding
    max_queue: 0
  delegate_to: localhost
  run_once: true

- name: Answers of at most 4096 tokens, 512 when the request does not say
  llmgw.cluster.llmgw_model:
    name: summarizer
    source: file:///srv/models/qwen2.5-7b-instruct-q4_k_m.gguf
    engine: llama.cpp
    profile: {class: a100-80g}
    max_tokens:
      default: 512
      max: 4096
      clamp: true     # a request above 4096 is lowered to it, not refused
  delegate_to: localhost
  run_once: true

- name: Roll a new version in place on a full fleet, 5 minutes for streams to finish
  llmgw.cluster.llmgw_model:
    name: chat
    source: file:///srv/models/qwen2.5-7b-instruct-q5_k_m.gguf
    engine: llama.cpp
    profile: {class: a100-80g}
    replicas: 4
    rollout:
      max_surge: 0
      max_unavailable: 1    # no room for a fifth replica: replace them one at a time
    drain_timeout_s: 5m
  delegate_to: localhost
  run_once: true

- name: A canary taking 10 % of the requests until llmgw ctl rollout promote chat
  llmgw.cluster.llmgw_model:
    name: chat
    source: file:///srv/models/qwen2.5-7b-instruct-q6_k.gguf
    engine: llama.cpp
    profile: {class: a100-80g}
    replicas: 4
    rollout: {canary_percent: 10}
  delegate_to: localhost
  run_once: true

- name: Remove a model
  llmgw.cluster.llmgw_model:
    control_url: https://ctl1.example.net:8470
    token: "{{ llmgw_admin_token }}"
    name: old-model
    state: absent
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
model:
  description:
    - The model as the admin API returns it after the task (C(GET /api/v1/models/<name>)),
      with its state. Empty after O(state=absent).
    - In check mode, the stored model with the declared fields laid over it.
  returned: always
  type: dict
  sample:
    name: qwen2.5-7b-instruct
    source: file:///srv/models/qwen2.5-7b-instruct-q4_k_m.gguf
    engine: llama.cpp
    profile: {class: h100-80g, gpus: 1, tp: 1, pp: 1, nodes: 1, memory_gb: 9.0}
    replicas: 2
    replicas_max: 4
    on_demand: false
    idle_stop_after_s: null
    autoscale: {wait_target_s: 2.0, up_after_s: 30.0, busy_below: 0.3, down_after_s: 300.0,
                cooldown_s: 60.0}
    args: ["--ctx-size", "8192"]
    strategy: binpack
    sha256: null
    size_bytes: null
    routing: prefix-affinity
    slots: 8
    max_queue: 100
    max_wait_s: 30.0
    aliases: [qwen]
    fallback: []
    max_tokens: {default: 512, max: 4096, clamp: false}
    rollout: {max_surge: 1, max_unavailable: 0, canary_percent: 0}
    drain_timeout_s: 120.0
    state: starting
    reason: null
    ready: 0
    wanted: 2
    parked: false
changed_fields:
  description:
    - The compared fields that differed (all of them for a new model), named as the
      server stores them. A O(replicas) range shows as C(replicas) (its min),
      C(replicas_max) and C(on_demand); O(idle_stop_after) as C(idle_stop_after_s).
  returned: always
  type: list
  elements: str
  sample: [replicas]
status:
  description: HTTP status of the control service's refusal.
  returned: failure
  type: int
  sample: 400
reason:
  description: The control service's error reason, for example C(invalid_catalog).
  returned: failure
  type: str
  sample: invalid_catalog
details:
  description: Every problem the control service named.
  returned: failure
  type: list
  elements: str
  sample: ["models[0] (qwen): engine 'foo' is unknown; use one of llama.cpp, vllm"]
"""

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible_collections.llmgw.cluster.plugins.module_utils.llmgw_api import (
    ENV_ADMIN_TOKEN,
    ENV_CA_FILE,
    ENV_CONTROL_URL,
    LlmgwApiError,
    LlmgwClient,
)
from ansible_collections.llmgw.cluster.plugins.module_utils.llmgw_catalog import (
    declared,
    differences,
    stored,
)


def argument_spec():
    return dict(
        control_url=dict(type="str", required=True, fallback=(env_fallback, [ENV_CONTROL_URL])),
        token=dict(type="str", required=True, no_log=True,
                   fallback=(env_fallback, [ENV_ADMIN_TOKEN])),
        ca_path=dict(type="path", fallback=(env_fallback, [ENV_CA_FILE])),
        validate_certs=dict(type="bool", default=True),
        timeout=dict(type="int", default=30),
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        source=dict(type="str"),
        engine=dict(type="str"),
        profile=dict(type="dict", options=dict(
            gpus=dict(type="int"), tp=dict(type="int"), pp=dict(type="int"),
            nodes=dict(type="int"), memory_gb=dict(type="float"),
            **{"class": dict(type="str", required=True)})),
        replicas=dict(type="raw"),
        on_demand=dict(type="bool"),
        idle_stop_after=dict(type="raw"),
        autoscale=dict(type="dict", options=dict(
            wait_target_s=dict(type="raw"), up_after_s=dict(type="raw"),
            busy_below=dict(type="float"), down_after_s=dict(type="raw"),
            cooldown_s=dict(type="raw"))),
        args=dict(type="list", elements="str"),
        strategy=dict(type="str"),
        sha256=dict(type="str"),
        size_bytes=dict(type="int"),
        routing=dict(type="str"),
        slots=dict(type="int"),
        max_queue=dict(type="int"),
        max_wait_s=dict(type="float"),
        aliases=dict(type="list", elements="str"),
        fallback=dict(type="list", elements="str"),
        max_tokens=dict(type="dict", options=dict(
            default=dict(type="int"), max=dict(type="int"), clamp=dict(type="bool"))),
        rollout=dict(type="dict", options=dict(
            max_surge=dict(type="int"), max_unavailable=dict(type="int"),
            canary_percent=dict(type="int"))),
        drain_timeout_s=dict(type="raw"),
    )


def ensure_present(module, client, current):
    entry, after = declared(module.params)
    before = stored(current)
    changed_fields = differences(before, after)
    result = {"changed": bool(changed_fields), "changed_fields": changed_fields,
              "model": current or {}}
    if module._diff:
        result["diff"] = {"before": before, "after": after}
    if not changed_fields:
        return result
    if module.check_mode:
        preview = dict(current or {})
        preview.update(after)
        result["model"] = preview
        return result
    client.put_catalog([entry])
    result["model"] = client.get_model(module.params["name"]) or {}
    return result


def ensure_absent(module, client, current):
    result = {"changed": current is not None, "changed_fields": [], "model": {}}
    if current is None:
        return result
    before = stored(current)
    result["changed_fields"] = [k for k in before if before[k] is not None]
    if module._diff:
        result["diff"] = {"before": before, "after": {}}
    if not module.check_mode:
        client.delete_model(module.params["name"])
    return result


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        required_if=[("state", "present", ("source", "engine", "profile"))],
        supports_check_mode=True,
    )
    params = module.params
    try:
        client = LlmgwClient(params["control_url"], params["token"], ca_path=params["ca_path"],
                             validate_certs=params["validate_certs"], timeout=params["timeout"])
        current = client.get_model(params["name"])
        if params["state"] == "present":
            result = ensure_present(module, client, current)
        else:
            result = ensure_absent(module, client, current)
    except LlmgwApiError as exc:
        module.fail_json(msg=exc.describe(), **exc.as_result())
    module.exit_json(**result)


if __name__ == "__main__":
    main()
