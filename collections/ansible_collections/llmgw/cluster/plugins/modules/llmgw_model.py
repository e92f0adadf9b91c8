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
    fields with the stored definition after filling in the defaults the server fills in
    (profile C(gpus), C(tp), C(pp) and C(nodes) 1, O(replicas) 1, O(on_demand) false,
    O(args) empty), and only when they differ sends C(PUT /api/v1/catalog) with a catalog
    that holds just this model. That call upserts; it never deletes other models.
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
    description: How many replicas to run. The server's default is 1.
    type: int
  on_demand:
    description:
      - Start no replica until the first request for the model. The server's default is
        false.
    type: bool
  idle_stop_after:
    description:
      - For an on-demand model, stop its replicas after this long without a request,
        for example C(30m), C(1h), C(90s) or a number of seconds.
      - The server stores it as seconds (C(idle_stop_after_s)); C(30m) and C(1800) are the
        same value.
    type: raw
  args:
    description: Extra engine arguments, for example C(["--ctx-size", "8192"]).
    type: list
    elements: str
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
    on_demand: false
    idle_stop_after_s: null
    args: ["--ctx-size", "8192"]
    state: starting
    reason: null
    ready: 0
    wanted: 2
    parked: false
changed_fields:
  description: The compared fields that differed (all of them for a new model).
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
        replicas=dict(type="int"),
        on_demand=dict(type="bool"),
        idle_stop_after=dict(type="raw"),
        args=dict(type="list", elements="str"),
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
