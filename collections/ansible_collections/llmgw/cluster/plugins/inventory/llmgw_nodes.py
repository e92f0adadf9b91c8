# Copyright: llmgw maintainers

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llmgw_nodes
short_description: The nodes an llmgw control service knows, grouped by fabric and device class
version_added: "0.1.0"
description:
  - Reads C(GET /api/v1/nodes) of an llmgw control service (admin token) and makes each
    node a host, with C(ansible_host) set to the address its agent reported.
  - "Host variables: C(llmgw_fabric), C(llmgw_devices) (the devices as the agent reported
    them), C(llmgw_device_classes) (sorted, unique), C(llmgw_last_report) (Unix seconds),
    C(llmgw_agent_version) and C(llmgw_engines)."
  - "Groups: C(fabric_<fabric>) for nodes with a fabric, C(class_<device class>) for every
    device class a node has, and C(fabric_<fabric>_class_<device class>) for both, so a
    play can target all nodes of fabric C(ib-a) with C(h100-80g) devices as
    C(fabric_ib_a_class_h100_80g). Names are lower-cased and every character other than
    a letter, digit or underscore becomes C(_) (C(a100-80g-mig-3g.40gb) gives
    C(class_a100_80g_mig_3g_40gb))."
  - The configuration file's name must end in C(llmgw_nodes.yml) or C(llmgw_nodes.yaml).
author:
  - llmgw maintainers
extends_documentation_fragment:
  - constructed
options:
  plugin:
    description: Marks the file as this plugin's configuration.
    type: str
    required: true
    choices: [llmgw.cluster.llmgw_nodes]
  control_url:
    description: Base URL of the control service, for example C(https://ctl1.example.net:8470).
    type: str
    required: true
    env:
      - name: LLMGW_CONTROL_URL
  token:
    description:
      - The admin token (C(llmgw-admin-...)). Prefer the environment variable, or encrypt
        the value with ansible-vault.
    type: str
    required: true
    env:
      - name: LLMGW_ADMIN_TOKEN
  ca_path:
    description: PEM file of the CA that signed the control service's certificate.
    type: path
    env:
      - name: LLMGW_CA_FILE
  validate_certs:
    description: Verify the control service's TLS certificate. Turn off only for tests.
    type: bool
    default: true
  timeout:
    description: Seconds to wait for the control service's answer.
    type: int
    default: 30
"""

EXAMPLES = r"""
# inventory/site.llmgw_nodes.yml, with LLMGW_CONTROL_URL and LLMGW_ADMIN_TOKEN set:
#   ansible-inventory -i inventory/site.llmgw_nodes.yml --graph
plugin: llmgw.cluster.llmgw_nodes

# The URL and the CA in the file, the token from the environment:
# plugin: llmgw.cluster.llmgw_nodes
# control_url: https://ctl1.example.net:8470
# ca_path: /etc/llmgw/ca.crt

# Also put every node in llmgw_agents, and group by agent version (constructed options):
# plugin: llmgw.cluster.llmgw_nodes
# groups:
#   llmgw_agents: true
# keyed_groups:
#   - key: llmgw_agent_version
#     prefix: agent

# Then, in a playbook: every node of fabric ib-a with H100s
# - hosts: fabric_ib_a_class_h100_80g
"""

import re

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Constructable
from ansible_collections.llmgw.cluster.plugins.module_utils.llmgw_api import (
    LlmgwApiError,
    LlmgwClient,
)

_UNSAFE = re.compile(r"[^a-z0-9_]")


def group_part(value):
    """A device class or fabric as part of a group name: h100-80g -> h100_80g."""
    return _UNSAFE.sub("_", str(value).strip().lower())


def node_groups(node):
    """The plugin's group names for one node of GET /api/v1/nodes."""
    classes = device_classes(node)
    groups = ["class_" + group_part(c) for c in classes]
    fabric = node.get("fabric")
    if fabric:
        groups.append("fabric_" + group_part(fabric))
        groups += [f"fabric_{group_part(fabric)}_class_{group_part(c)}" for c in classes]
    return groups


def device_classes(node):
    return sorted({d["class"] for d in node.get("devices") or []
                   if isinstance(d, dict) and d.get("class")})


def host_vars(node):
    out = {
        "llmgw_fabric": node.get("fabric"),
        "llmgw_devices": node.get("devices") or [],
        "llmgw_device_classes": device_classes(node),
        "llmgw_last_report": node.get("last_report"),
        "llmgw_agent_version": node.get("agent_version"),
        "llmgw_engines": node.get("engines") or [],
    }
    if node.get("address"):
        out["ansible_host"] = node["address"]
    return out


class InventoryModule(BaseInventoryPlugin, Constructable):
    NAME = "llmgw.cluster.llmgw_nodes"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("llmgw_nodes.yml",
                                                            "llmgw_nodes.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        try:
            client = LlmgwClient(self.get_option("control_url"), self.get_option("token"),
                                 ca_path=self.get_option("ca_path"),
                                 validate_certs=self.get_option("validate_certs"),
                                 timeout=self.get_option("timeout"))
            nodes = client.nodes()
        except LlmgwApiError as exc:
            raise AnsibleParserError(f"llmgw_nodes: {exc.describe()}") from None
        for node in nodes:
            self._add_node(node)

    def _add_node(self, node):
        name = self.inventory.add_host(node["name"])
        variables = host_vars(node)
        for key, value in variables.items():
            self.inventory.set_variable(name, key, value)
        for group in node_groups(node):
            self.inventory.add_group(group)
            self.inventory.add_child(group, name)
        strict = self.get_option("strict")
        self._set_composite_vars(self.get_option("compose"), variables, name, strict=strict)
        self._add_host_to_composed_groups(self.get_option("groups"), variables, name,
                                          strict=strict)
        self._add_host_to_keyed_groups(self.get_option("keyed_groups"), variables, name,
                                       strict=strict)
