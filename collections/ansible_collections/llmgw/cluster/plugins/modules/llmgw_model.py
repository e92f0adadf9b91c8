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
extends_documentation_fragment:
  - llmgw.cluster.llmgw_catalog    # the catalog entry's fields: name, source, engine, ...
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
  state:
    description: Whether the model is in the catalog.
    type: str
    choices: [present, absent]
    default: present
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
