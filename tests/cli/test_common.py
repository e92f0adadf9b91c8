"""``cli/common.py``: ctl builds request bodies as the API's messages, and a field the
message refuses is a click error naming the option, before anything is sent."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from llmgw_runtime.api.admin import KeyCreate, KeyUpdate
from llmgw_runtime.cli.common import request_body
from llmgw_runtime.cli.keys import OPTIONS
from llmgw_runtime.cli.main import cli


def refused(message: type[KeyCreate] | type[KeyUpdate], **fields: object) -> click.UsageError:
    with pytest.raises(click.UsageError) as info:
        request_body(message, OPTIONS, **fields)
    return info.value


def test_a_valid_body_is_the_message_with_only_the_fields_given() -> None:
    body = request_body(KeyCreate, OPTIONS, name="ci", rpm=60)
    assert body.to_json() == {"name": "ci", "rpm": 60}


def test_a_value_out_of_the_messages_bounds_names_its_option() -> None:
    err = refused(KeyCreate, name="ci", tpm=0)
    assert isinstance(err, click.BadParameter)
    assert err.format_message() == ("Invalid value for '--tpm': Input should be greater "
                                    "than or equal to 1 (got 0)")


def test_a_field_that_may_also_be_a_word_gives_only_the_numbers_reason() -> None:
    err = refused(KeyUpdate, rpm=2_000_000)
    assert err.format_message() == ("Invalid value for '--rpm': Input should be less than "
                                    "or equal to 1000000 (got 2000000)")


def test_every_bad_option_is_named_at_once() -> None:
    message = refused(KeyCreate, name="a b", rpm=0).format_message()
    assert message.startswith("Invalid value for 'NAME' / '--rpm': NAME: ")
    assert "; --rpm: Input should be greater than or equal to 1" in message


def test_a_bad_key_name_says_which_characters_a_name_may_have() -> None:
    message = refused(KeyCreate, name="bad name!").format_message()
    assert message == ("Invalid value for 'NAME': a key name has 1-100 letters, digits, "
                       "'.', '_', '@', '+' or '-', and starts with a letter or digit (no "
                       "spaces) (got 'bad name!')")
    assert "pattern" not in message and "[A-Z" not in message


@pytest.mark.parametrize(("argv", "says"), [
    (["create", "ci", "--expires", "5y"], "'5y' is not a lifetime; write a number of days, "
     "hours or minutes like 30d, 12h or 90m (at most 3650d)"),
    (["create", "ci", "--expires", "99999d"], "'99999d' is longer than a key may live"),
    (["set", "ci", "--expires", "5y"], "like 30d, 12h or 90m (at most 3650d), or never"),
])
def test_a_bad_expiry_names_the_forms_it_may_take(argv: list[str], says: str) -> None:
    result = CliRunner().invoke(cli, ["ctl", "--url", "http://127.0.0.1:1", "--token", "x",
                                      "keys", *argv])
    assert result.exit_code == 2 and says in result.output, result.output
