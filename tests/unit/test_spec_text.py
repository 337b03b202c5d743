"""A spec as respawn shows it to a person: the user's text, never a secret in it
(``controller.render.spec_text``, the dashboard's job page and its JSON)."""

from __future__ import annotations

import pytest

from controller.render.spec_text import REWRITTEN, UNREADABLE, shown


def test_the_text_is_kept_comments_and_all_with_the_webhook_and_secret_env_values_hidden():
    raw = (b"zones: [us-central1-a]  # the cheap one\n"
           b"notify:\n  webhook: https://hooks.example.com/T000/B000/credential  # the team's\n"
           b"env: {HF_TOKEN: hf_credential, TOKENIZERS_PARALLELISM: 'false', STEPS: '10'}\n"
           b"command: huggingface-cli login --token hf_credential && python train.py\n")
    assert shown(raw) == ("zones: [us-central1-a]  # the cheap one\n"
                          "notify:\n  webhook: https://hooks.example.com/<redacted>  # the team's\n"
                          "env: {HF_TOKEN: <redacted>, TOKENIZERS_PARALLELISM: 'false', STEPS: '10'}\n"
                          "command: huggingface-cli login --token <redacted> && python train.py\n")


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GH_TOKEN", "hf_token",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "BASIC_AUTH"])
def test_an_env_value_whose_name_says_secret_is_hidden(name):
    assert "s3cr3t-value" not in shown(f"env: {{{name}: s3cr3t-value}}\n".encode())


def test_a_slack_webhook_anywhere_is_hidden_and_an_alias_of_the_webhook_too():
    raw = (b"# was https://hooks.slack.com/services/T1/B1/oldcredential\n"
           b"notify: {webhook: &w https://h.example.com/p/credential}\nx: *w\n")
    text = shown(raw)
    assert "credential" not in text and text.startswith("# was https://hooks.slack.com/<redacted>\n")


def test_a_secret_too_short_to_replace_in_text_is_hidden_in_the_spec_written_out_again():
    text = shown(b"zones: [us-central1-a]\nenv: {API_KEY: '1'}\nmax_failures: 1\n")
    assert text.startswith(REWRITTEN) and "API_KEY: <redacted>" in text and "max_failures: 1" in text
    assert "us-central1-a" in text  # the rest whole: only the field is replaced


def test_a_spec_that_is_no_yaml_respawn_reads_is_not_shown():
    assert shown(b"notify: {webhook: https://hooks.example.com/T/B/credential\n") == UNREADABLE
    assert shown(b"\xff\xfe not utf-8 https://hooks.example.com/T/B/credential") == UNREADABLE


def test_a_spec_without_secrets_is_its_text_unchanged():
    raw = "zones: [us-central1-a]\ncommand: python train.py --lr 1e-4  # ok\r\n"
    assert shown(raw.encode()) == raw
