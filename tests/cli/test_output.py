"""``cli/output.table``: every ``ctl`` listing at 80 columns wraps long text onto the
following lines of its row instead of cutting it, and gives the width to the columns that
need it (issue 28). Pure: rows in, text out."""

from __future__ import annotations

from llmgw_runtime.cli.output import layout, table

EVENTS = ("TIME", "KIND", "SUBJECT", "MESSAGE")
REPLICAS = ("REPLICA", "MODEL", "NODE:DEVICES", "PORT", "STATE", "STARTED", "LAST USED",
            "LAST ERROR")
KEYS = ("NAME", "PRIORITY", "MODELS", "EXPIRES", "RPM", "TPM", "CREATED")
ERROR = ("replica smollm2-135m-instruct-r0001 failed: llama_model_load: error loading "
         "model: tensor 'output.weight' data is not within the file bounds, model is "
         "corrupted or incomplete")


def words(rows: list[tuple[object, ...]]) -> list[str]:
    return [w for row in rows for cell in row for w in str(cell).split()]


def fits(text: str, width: int = 80) -> list[str]:
    lines = text.splitlines()
    assert max(map(len, lines)) <= width and "…" not in text, text
    return lines


def test_events_wrap_the_whole_message_in_a_wide_column() -> None:
    rows: list[tuple[object, ...]] = [
        ("2026-12-05 10:44:22", "failure", "smollm2-135m-instruct", ERROR),
        ("2026-12-05 10:44:20", "catalog", "smollm2-135m-instruct", "model updated")]
    lines = fits(table(rows, EVENTS, 80))
    shown = " ".join(lines).split()
    assert all(w in shown for w in words(rows)), lines          # nothing is cut
    start = lines[0].index("MESSAGE")
    message = [line[start:] for line in lines[1:]]
    assert max(map(len, message)) > 22                           # not ~22 characters
    assert " ".join(m.strip() for m in message if m.strip()).startswith(ERROR)
    assert lines[-1].split()[-2:] == ["model", "updated"]        # the next row follows


def test_replicas_keep_names_whole_when_the_last_error_is_empty() -> None:
    rows: list[tuple[object, ...]] = [
        ("smollm2-135m-instruct-r0001", "smollm2-135m-instruct", "vm:cpu", 8101, "ready",
         "5m ago", "2m ago", ""),
        ("qwen2.5-7b-instruct-r0002", "qwen2.5-7b-instruct", "gpu-01:0/mig1", 8102,
         "draining (3 in flight, 40 s left)", "9m ago", "-", "")]
    lines = fits(table(rows, REPLICAS, 80, optional=(3, 5, 6)))   # as ctl replicas
    shown = " ".join(lines).split()
    for name in ("smollm2-135m-instruct-r0001", "smollm2-135m-instruct",
                 "qwen2.5-7b-instruct-r0002", "qwen2.5-7b-instruct", "gpu-01:0/mig1"):
        assert name in shown, lines
    assert "ERROR" not in lines[0]       # a column with no values takes no width
    assert all(w in shown for w in "draining (3 in flight, 40 s left)".split())


def test_keys_list_wraps_the_models_between_names() -> None:
    models = ", ".join(["chat", "embed", "smollm2-135m-instruct", "qwen2.5-7b-instruct",
                        "llama-3.1-8b-instruct", "mistral-7b-instruct-v0.3"])
    rows: list[tuple[object, ...]] = [("partner-app", "normal", models, "in 29 d", "60",
                                       "10000", "3h ago")]
    lines = fits(table(rows, KEYS, 80))
    assert len(lines) > 2
    assert all(w in " ".join(lines).split() for w in words(rows)), lines


def test_a_word_longer_than_its_column_is_broken_not_cut() -> None:
    path = "/var/lib/llmgw/weights/" + "x" * 150 + ".gguf"
    lines = fits(table([("m", f"cannot read {path}")], ("MODEL", "REASON"), 80))
    assert path in "".join(line[lines[0].index("REASON"):].strip() for line in lines[1:])


def test_a_table_that_fits_is_one_line_per_row_and_keeps_every_column() -> None:
    lines = fits(table([("a", "ready", "-"), ("b", "parked", "oom")],
                       ("MODEL", "STATE", "REASON"), 80))
    assert lines == ["MODEL  STATE   REASON", "a      ready   -", "b      parked  oom"]


def test_layout_narrows_the_other_columns_to_their_longest_word_before_the_last() -> None:
    # TIME (19, longest word 10), SUBJECT (21, one word), MESSAGE (200): the message keeps
    # a quarter of the line before TIME wraps; the subject is never broken
    keep, widths = layout([4, 7, 7], [19, 21, 200], [10, 21, 30], [False] * 3, 80)
    assert keep == [0, 1, 2] and widths[1] == 21 and widths[2] >= 30
    assert sum(widths) + 2 * 2 == 80
