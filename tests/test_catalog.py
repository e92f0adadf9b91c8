"""Catalog validation: each rule, and every problem reported at once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.errors import CatalogError


def entry(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "qwen", "source": "file:///m/qwen.gguf",
                               "engine": "llama.cpp", "profile": {"class": "a100-80g"}}
    base.update(over)
    return base


def problems(*entries: object) -> list[str]:
    with pytest.raises(CatalogError) as info:
        catalog.validate({"models": list(entries)})
    return info.value.details


def test_a_good_entry_gets_defaults() -> None:
    [spec] = catalog.validate({"models": [entry()]})
    assert spec.replicas == 1 and not spec.on_demand and spec.args == ()
    assert spec.profile.gpus == spec.profile.tp == spec.profile.pp == spec.profile.nodes == 1


def test_unknown_engine_names_model_and_field() -> None:
    [msg] = problems(entry(engine="tgi"))
    assert "models[0] (qwen)" in msg and "engine 'tgi' is unknown" in msg
    assert "llama.cpp, vllm" in msg


def test_tp_times_pp_must_equal_gpus_times_nodes() -> None:
    [msg] = problems(entry(profile={"class": "h100-80g", "gpus": 4, "tp": 2, "pp": 1}))
    assert "tp x pp (2 x 1) must equal gpus x nodes (4 x 1)" in msg


@pytest.mark.parametrize("field", ["gpus", "tp", "pp", "nodes"])
def test_mig_class_refuses_more_than_one_of_anything(field: str) -> None:
    profile = {"class": "a100-80g-mig-3g.40gb", "gpus": 1, "tp": 1, "pp": 1, "nodes": 1}
    profile[field] = 2
    msgs = problems(entry(profile=profile))
    assert any(f"profile.{field} is 2" in m and "exactly one instance" in m for m in msgs)


@pytest.mark.parametrize("name", ["has space", "/leading", ".hidden", "", "tab\tname"])
def test_names_the_router_cannot_route_are_refused(name: str) -> None:
    [msg] = problems(entry(name=name))
    assert "cannot be routed" in msg


def test_names_with_org_slash_are_routable() -> None:
    [spec] = catalog.validate({"models": [entry(name="Qwen/Qwen2.5-7B-Instruct")]})
    assert spec.name == "Qwen/Qwen2.5-7B-Instruct"


def test_unknown_fields_are_named_with_the_known_ones() -> None:
    msgs = problems(entry(colour="red", profile={"class": "cpu", "gpu": 1}))
    assert any("colour is not a known field" in m for m in msgs)
    assert any("profile.gpu is not a known field" in m and "gpus" in m for m in msgs)


def test_every_problem_is_reported_at_once_across_entries() -> None:
    msgs = problems(entry(engine="x"), entry(name="b", source="relative/path",
                                              replicas=-1), entry(name="qwen"))
    assert len(msgs) == 4
    assert any("models[1] (b): source" in m for m in msgs)
    assert any("models[1] (b): replicas must be at least 0" in m for m in msgs)
    assert any("also used by models[0]" in m for m in msgs)


def test_booleans_must_be_real_booleans() -> None:
    [msg] = problems(entry(on_demand="yes"))
    assert "on_demand must be true or false" in msg


def test_idle_stop_after_needs_on_demand_and_a_duration() -> None:
    assert any("applies only to on_demand" in m for m in problems(entry(idle_stop_after="5m")))
    assert any("not a duration" in m
               for m in problems(entry(on_demand=True, idle_stop_after="soon")))
    [spec] = catalog.validate({"models": [entry(on_demand=True, idle_stop_after="30m")]})
    assert spec.idle_stop_after_s == 1800


def test_malformed_yaml_says_where() -> None:
    with pytest.raises(CatalogError) as info:
        catalog.parse("models:\n  - name: a\n    profile: {class: cpu\n")
    assert "not valid YAML at line" in info.value.message


def test_a_document_without_models_says_how_to_write_it() -> None:
    with pytest.raises(CatalogError) as info:
        catalog.parse("- name: a\n")
    assert "'models' list" in info.value.message


def test_definition_hash_changes_with_args_not_with_replicas() -> None:
    [a] = catalog.validate({"models": [entry()]})
    [b] = catalog.validate({"models": [entry(replicas=3)]})
    [c] = catalog.validate({"models": [entry(args=["--ctx-size", "4096"])]})
    assert a.definition_hash == b.definition_hash != c.definition_hash


@pytest.mark.parametrize("over, words", [
    ({"strategy": "random"}, "strategy 'random' is unknown; use binpack"),
    ({"source": "https://x/m.gguf", "sha256": "abc"}, "sha256 must be 64 hexadecimal digits"),
    ({"source": "https://x/m.gguf", "size_bytes": 0}, "size_bytes must be at least 1"),
    ({"source": "hf://Org/Repo/m.gguf", "sha256": "a" * 64},
     "huggingface_hub checks hf:// downloads itself"),
])
def test_placement_and_download_fields_are_checked(over: dict[str, object], words: str) -> None:
    assert any(words in m for m in problems(entry(**over)))


def test_checksum_is_part_of_the_definition_but_strategy_is_not() -> None:
    base = {"source": "https://x/m.gguf"}
    [plain] = catalog.validate({"models": [entry(**base)]})
    [spread] = catalog.validate({"models": [entry(strategy="spread", **base)]})
    [summed] = catalog.validate({"models": [entry(sha256="A" * 64, **base)]})
    assert spread.strategy == "spread" and spread.definition_hash == plain.definition_hash
    assert summed.sha256 == "a" * 64 and summed.definition_hash != plain.definition_hash


# -- bounds ----------------------------------------------------------------------------------

def parse_error(text: str) -> CatalogError:
    with pytest.raises(CatalogError) as info:
        catalog.parse(text)
    return info.value


@pytest.mark.parametrize("over, words", [
    ({"replicas": 100_000_000}, "replicas must be at most 256 (llmgw's MAX_REPLICAS), not "
                                "100000000"),
    ({"profile": {"class": "h100-80g", "gpus": 17, "tp": 17}},
     "profile.gpus must be at most 16 (llmgw's MAX_GPUS)"),
    ({"profile": {"class": "h100-80g", "nodes": 65, "tp": 65}},
     "profile.nodes must be at most 64 (llmgw's MAX_NODES)"),
    ({"profile": {"class": "h100-80g", "tp": 2000}}, "profile.tp must be at most 1024"),
    ({"profile": {"class": "h100-80g", "pp": 2000}}, "profile.pp must be at most 1024"),
    ({"profile": {"class": "cpu", "memory_gb": float("nan")}}, "at most 16384"),
    ({"profile": {"class": "cpu", "memory_gb": float("inf")}}, "(llmgw's MAX_MEMORY_GB)"),
    ({"profile": {"class": "c" * 65}}, "at most 64 characters"),
    ({"args": ["--ctx-size", "8192"] * 33}, "args has 66 items, over the maximum of 64 "
                                            "(llmgw's MAX_ARGS)"),
    ({"args": ["--chat-template", "x" * 1025]}, "args[1] is 1025 characters, over the "
                                                "maximum of 1024 (llmgw's MAX_ARG_CHARS)"),
    ({"args": ["--chat-template", "a\0b"]}, "NUL character"),
    ({"name": "n" * 201}, "at most 200 characters (llmgw's MAX_NAME_CHARS)"),
    ({"source": "https://x/" + "p/" * 1100 + "m.gguf"}, "over the maximum of 2048 (llmgw's "
                                                         "MAX_SOURCE_CHARS)"),
    ({"source": "/m/a\nb.gguf"}, "holds a control character"),
    ({"source": "https://x/m.gguf", "size_bytes": 1 << 60}, "(llmgw's MAX_SIZE_BYTES)"),
    ({"on_demand": True, "idle_stop_after": float("inf")}, "finite number of seconds"),
    ({"on_demand": True, "idle_stop_after": "400d"}, "at most 365d"),
])
def test_every_count_and_length_has_a_maximum_named_in_the_message(
        over: dict[str, object], words: str) -> None:
    msgs = problems(entry(**over))
    assert any(words in m for m in msgs), msgs


def test_the_largest_allowed_values_are_accepted() -> None:
    [spec] = catalog.validate({"models": [entry(
        replicas=256, name="n" * 200, args=["--ctx-size", "x" * 1024] + ["-v"] * 62,
        profile={"class": "h100-80g", "gpus": 16, "nodes": 64, "tp": 1024, "pp": 1})]})
    assert spec.replicas == 256 and spec.profile.tp == 1024 and len(spec.args) == 64


def test_a_catalog_with_more_than_the_maximum_models_is_refused_at_once() -> None:
    entries = [entry(name=f"m{i}") for i in range(2001)]
    with pytest.raises(CatalogError) as info:
        catalog.validate({"models": entries})
    assert "2001 models, over the maximum of 2000 (llmgw's MAX_MODELS)" in info.value.message


def test_aliases_that_multiply_are_refused_with_a_short_message() -> None:
    # "billion laughs": 9 levels of 9 aliases each would be 387 million strings
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    lines.append("models: [{name: x, source: *a8, engine: llama.cpp, profile: {class: cpu}}]")
    error = parse_error("\n".join(lines))
    assert "aliases expand to more than" in error.message and "MAX_EXPANDED" in error.message
    assert "nothing was applied" in error.message
    assert len(str(error)) < 1000


def test_a_small_shared_anchor_is_still_fine() -> None:
    specs = catalog.parse("models:\n"
                          "  - {name: a, source: /m/a.gguf, engine: llama.cpp,\n"
                          "     profile: &cpu {class: cpu, memory_gb: 2}}\n"
                          "  - {name: b, source: /m/b.gguf, engine: llama.cpp, profile: *cpu}\n")
    assert [s.profile.memory_gb for s in specs] == [2.0, 2.0]


def test_an_alias_inside_the_node_it_names_is_refused() -> None:
    assert "refers to the node that holds it" in parse_error("models: &m [*m]\n").message


@pytest.mark.parametrize("text", [
    pytest.param("models: " + "[" * 40 + "]" * 40, id="flow-40"),
    pytest.param("models: " + "[" * 5000 + "]" * 5000, id="flow-5000"),
    pytest.param("models:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 400)),
                 id="block-400"),
])
def test_deep_nesting_is_refused_naming_the_limit(text: str) -> None:
    error = parse_error(text)
    assert "nests deeper than 16 levels (MAX_DEPTH)" in error.message


def test_a_catalog_over_the_size_limit_is_refused_before_reading_it() -> None:
    text = "models: []\n# " + "x" * (4 * 1024 * 1024)
    error = parse_error(text)
    assert "over the maximum of 4194304 bytes (MAX_CATALOG_BYTES)" in error.message


def test_an_integer_too_long_to_read_is_a_catalog_error() -> None:
    error = parse_error("models: [{name: x, source: /m, engine: llama.cpp, "
                        "profile: {class: cpu}, replicas: " + "9" * 5000 + "}]")
    assert "cannot be read" in error.message and len(str(error)) < 1000


def test_the_error_lists_a_bounded_number_of_problems_each_cut_short() -> None:
    huge = "x" * 100_000
    entries = [entry(name=f"m{i}", engine=huge, colour={huge: [huge] * 100}) for i in range(300)]
    with pytest.raises(CatalogError) as info:
        catalog.validate({"models": entries})
    details = info.value.details
    assert info.value.message == "the catalog has 600 problems; nothing was applied"
    assert len(details) == 51
    assert details[-1] == "... and 550 more problems (only the first 50 are listed)"
    assert all(len(d) <= 400 for d in details)
    assert len(str(info.value)) < 30_000


# -- args the agent owns -----------------------------------------------------------------------

@pytest.mark.parametrize("engine, args, named", [
    ("llama.cpp", ["--host", "0.0.0.0"], "--host"),
    ("llama.cpp", ["--host=0.0.0.0"], "--host"),
    ("llama.cpp", ["--ho", "0.0.0.0"], "--ho"),
    ("llama.cpp", ["--port", "80"], "--port"),
    ("llama.cpp", ["-m", "/etc/shadow"], "-m"),
    ("llama.cpp", ["--alias", "other"], "--alias"),
    ("llama.cpp", ["--api-key", "k"], "--api-key"),
    ("llama.cpp", ["-hf", "org/repo"], "-hf"),
    ("llama.cpp", ["--model-url", "https://x/m.gguf"], "--model-url"),
    ("llama.cpp", ["--rpc", "10.0.0.1:50052"], "--rpc"),
    ("llama.cpp", ["--log-file", "/etc/cron.d/x"], "--log-file"),
    ("llama.cpp", ["--slot-save-path", "/"], "--slot-save-path"),
    ("llama.cpp", ["--path", "/"], "--path"),
    ("vllm", ["--host", "0.0.0.0"], "--host"),
    ("vllm", ["--served_model_name", "other"], "--served_model_name"),
    ("vllm", ["--port=80"], "--port"),
    ("vllm", ["--model", "/x"], "--model"),
    ("vllm", ["--download-dir", "/etc"], "--download-dir"),
    ("vllm", ["--ssl-keyfile", "k.pem"], "--ssl-keyfile"),
    ("vllm", ["--config", "args.yaml"], "--config"),
    ("vllm", ["--master-addr", "evil"], "--master-addr"),
    ("vllm", ["--allowed-local-media-path", "/"], "--allowed-local-media-path"),
    ("vllm", ["--po", "80"], "--po"),
])
def test_args_that_set_what_the_agent_owns_are_refused_naming_them(
        engine: str, args: list[str], named: str) -> None:
    [msg] = problems(entry(engine=engine, args=args))
    assert f"args {named} set what the agent owns for {engine}" in msg
    assert "models[0] (qwen)" in msg and "remove them" in msg


@pytest.mark.parametrize("engine, args", [
    ("llama.cpp", ["--ctx-size", "8192", "-ngl", "99", "-mg", "0", "--metrics"]),
    ("llama.cpp", ["--threads", "4", "--parallel", "2", "--cont-batching", "-md", "d.gguf"]),
    ("vllm", ["--tensor-parallel-size", "2", "-pp", "1", "--max-model-len", "4096"]),
    ("vllm", ["--tokenizer", "Qwen/Qwen2.5-7B-Instruct", "--model-impl", "auto", "--", "-1"]),
])
def test_engine_args_the_agent_does_not_own_are_kept(engine: str, args: list[str]) -> None:
    [spec] = catalog.validate({"models": [entry(engine=engine, args=args)]})
    assert spec.args == tuple(args)


# -- sources the agent writes ------------------------------------------------------------------

@pytest.mark.parametrize("source, words", [
    ("https://x/a%2F..%2F..%2F.ssh%2Fauthorized_keys", "holds a path separator"),
    ("https://x/dir/%2Fetc%2Fcron.d%2Fx", "holds a path separator"),
    ("https://x/%2E%2E", "has no file name"),
    ("https://x/..%5C..%5Cx", "holds a path separator"),
    ("https://x/m%00.gguf", "holds a control character"),
    ("https://x/.locks", "starts with a dot"),
    ("https://x/m.gguf.part", "partial downloads"),
    ("https://x/" + "a" * 256, "longer than 255 bytes"),
    ("hf://org/repo/../../x.gguf", "is . or .."),
    ("hf://org/../x.gguf", "is . or .."),
    ("hf://org/repo/a\\..\\b.gguf", "holds a path separator"),
    ("hf://org//etc/passwd", "must be hf://org/repo/file"),
])
def test_a_source_whose_download_would_escape_the_weights_directory_is_refused(
        source: str, words: str) -> None:
    [msg] = problems(entry(source=source))
    assert "models[0] (qwen): source" in msg and words in msg
    assert "%2F" not in source or "once decoded" in msg


@pytest.mark.parametrize("source", [
    "https://x/models/qwen2.5-7b-q4_k_m.gguf?sig=abc", "https://x/m%20v2.gguf",
    "hf://Qwen/Qwen2.5-7B-Instruct-GGUF/sub/qwen.gguf", "hf://org/repo",
])
def test_plain_download_names_are_accepted(source: str) -> None:
    [spec] = catalog.validate({"models": [entry(source=source)]})
    assert spec.source == source


# -- what a new operator trips over (issue 15) -------------------------------------------------

@pytest.mark.parametrize("missing, words", [
    ("source", "models[0] (qwen): source is required; add source: file:///PATH"),
    ("engine", "models[0] (qwen): engine is required; add engine: llama.cpp"),
    ("profile", "models[0] (qwen): profile is required (the devices one replica takes); "
                "add profile: {class: cpu}"),
])
def test_a_missing_field_is_called_required_with_what_to_write(missing: str,
                                                               words: str) -> None:
    raw = entry()
    del raw[missing]
    [msg] = problems(raw)
    assert msg.startswith(words)
    assert "None" not in msg


def test_args_written_as_one_string_are_refused_with_the_list_to_write() -> None:
    [msg] = problems(entry(args="--ctx-size 512 --threads 2"))
    assert msg == ("models[0] (qwen): args must be a list of strings like "
                   "[\"--ctx-size\", \"8192\"], not '--ctx-size 512 --threads 2'; write it as "
                   "[\"--ctx-size\", \"512\", \"--threads\", \"2\"]")


PLACEHOLDER = re.compile(r"\{[A-Za-z_]\w*(\.\w+|\[[^]]*\])*(![rsa])?\}")


@pytest.mark.parametrize("bad", [
    {"args": "--ctx-size 512"}, {"args": [None]}, {"profile": None}, {"profile": "cpu"},
    {"profile": {"class": "cpu", "gpus": "two"}}, {"source": None}, {"engine": None},
    {"name": None}, {"replicas": "x"}, {"on_demand": "yes"}, {"idle_stop_after": "soon"},
    {"strategy": "fast"}, {"sha256": "x"}, {"size_bytes": -1}, {"colour": 1},
    {"profile": {"class": "cpu"}, "args": ["--bogus"]},
    {"profile": {"class": "cpu"}, "args": ["-c", "many"]},
])
def test_no_message_prints_a_raw_placeholder(bad: dict[str, object]) -> None:
    raw = entry()
    for key, value in bad.items():
        raw[key] = value
    for msg in problems(raw):
        assert not PLACEHOLDER.search(msg), msg


def test_no_plain_string_in_the_catalog_code_holds_a_placeholder() -> None:
    """A ``{name!r}`` in a string that is not an f-string prints as written."""
    root = Path(catalog.__file__).parent.parent
    files = [*(root / "catalog").glob("*.py"), root / "api" / "catalog.py",
             *(root / "engines").glob("*.py")]
    found = []
    for path in files:
        tree = ast.parse(path.read_text())
        in_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                       for v in node.values}
        found += [f"{path.name}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in in_fstrings and PLACEHOLDER.search(node.value)]
    assert not found


@pytest.mark.parametrize("args, named", [
    (["--n-gpu-layers", "99"], "args --n-gpu-layers are not flags of the CPU engine"),
    (["--embeddings", "-fa", "on", "--mlock"], "args -fa, --mlock are not flags"),
    (["--ctx-size", "8k"], "args refused by the CPU engine (llama.cpp on class cpu, the "
                           "xllamacpp wheel): argument --ctx-size/-c: '8k' is not a whole"),
])
def test_a_cpu_model_with_args_the_cpu_engine_lacks_is_refused_at_apply(
        args: list[str], named: str) -> None:
    [msg] = problems(entry(profile={"class": "cpu"}, args=args))
    assert msg.startswith(f"models[0] (qwen): {named}")
    if "not flags" in named:
        assert ("it accepts only --ctx-size/-c, --threads/-t, --parallel/-np, "
                "--batch-size/-b, --ubatch-size/-ub, --embeddings/--embedding, --pooling, "
                "--chat-template") in msg
    assert 'docs/operations.md, "The CPU engine"' in msg


def test_a_cpu_model_with_the_cpu_engines_flags_is_accepted() -> None:
    args = ["--embeddings", "--pooling", "mean", "-c", "2048", "-t", "2", "-np", "2",
            "-b", "512", "-ub", "256", "--chat-template", "chatml"]
    [spec] = catalog.validate({"models": [entry(profile={"class": "cpu"}, args=args)]})
    assert spec.args == tuple(args)


def test_an_owned_flag_on_a_cpu_model_is_refused_once_as_owned() -> None:
    [msg] = problems(entry(profile={"class": "cpu"}, args=["--port", "80", "--bogus"]))
    assert "args --port set what the agent owns" in msg


# -- catalog-wide rules: every entry, every time (issue 28) -----------------------------------

def test_a_fallback_that_names_no_model_is_reported_beside_the_entrys_other_problems() -> None:
    found = problems(entry(args=["--port", "80"], fallback=["nope"]))
    assert len(found) == 2, found
    assert "args --port set what the agent owns" in found[0]
    assert "model qwen: fallback nope is not a model of the catalog" in found[1]


def test_every_fallback_that_names_no_model_is_reported_and_a_bad_entry_is_still_a_model(
        ) -> None:
    # fb-only has a problem of its own: it is still a model the catalog names
    found = problems(entry(fallback=["nope", "fb-only", "gone"]),
                     entry(name="fb-only", args=["--port", "80"], aliases=["chat"]),
                     entry(name="other", aliases=["chat"]))
    text = "\n".join(found)
    assert "fallback nope is not a model" in text and "fallback gone is not a model" in text
    assert "fallback fb-only" not in text
    assert "models[1] (fb-only): args --port" in text
    assert "alias chat is already an alias of model fb-only" in text     # clash: both named
    assert len(found) == 4, found


def test_fallbacks_may_name_the_models_that_stay_beside_the_catalog() -> None:
    [spec] = catalog.validate({"models": [entry(fallback=["kept"])]}, {"kept": ("k",)})
    assert spec.fallback == ("kept",)
    found = problems(entry(fallback=["kept", "nope"], aliases=["k"]))
    assert any("fallback kept is not a model" in p for p in found)
    with pytest.raises(CatalogError) as info:
        catalog.validate({"models": [entry(fallback=["kept", "nope"], aliases=["k"])]},
                         {"kept": ("k",)})
    assert info.value.details == [
        "model kept: alias k is already an alias of model qwen; an alias names one model only",
        "model qwen: fallback nope is not a model of the catalog; name a model it lists"]
