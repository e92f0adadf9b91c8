# Copyright: llmgw maintainers

from __future__ import annotations


class ModuleDocFragment:
    """The options of a catalog entry's fields, for llmgw.cluster.llmgw_model (its
    DOCUMENTATION says ``extends_documentation_fragment: [llmgw.cluster.llmgw_catalog]``).

    The fields and their rules are the catalog's (docs/catalog.md); module_utils/llmgw_catalog.py
    compares them, and tests/collection/test_llmgw_model_fields.py checks that every field of
    the entry is documented here, typed as the module's argument_spec types it."""

    DOCUMENTATION = r"""
options:
  name:
    description:
      - "The model's name, as clients write it in C(model). Letters, digits and
        C(. _ - : @ + /)."
    type: str
    required: true
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
