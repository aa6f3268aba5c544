"""Redaction, both directions: every form a secret takes in a log is masked, and the settings and counts that
merely look like secrets (SGLang's `*_token*` settings, `api_key=None`) stay visible — checked on the REAL
server_args line SGLang 0.5.17 logged on an H200."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from pytest_dflash.scrub.redact import MASK, is_secret, redact, redact_argv, redact_mapping_value, remember

ROOT = Path(__file__).parents[2]
RECORDED_LOGS = [
    ROOT.parent / "shared" / "data" / "sglang-0.5.17-h200" / "server_dflash_graph.log",
    ROOT / "tests" / "data" / "sglang-0.5.17-h200" / "logs" / "server_dflash_graph.log",
]


def server_args_line() -> str:
    """The `server_args=ServerArgs(...)` line of a real DFLASH launch (about 14 KB, ~400 settings)."""
    for path in RECORDED_LOGS:
        if path.is_file():
            for line in path.read_text().splitlines():
                if "server_args=ServerArgs(" in line:
                    return line
    pytest.skip("the recorded SGLang 0.5.17 logs are not in this checkout")


def settings(line: str) -> dict[str, str]:
    """name -> value of every top-level `name=value` of a ServerArgs repr."""
    return dict(re.findall(r"(?<![\w.])([a-z_][a-z0-9_]*)=('[^']*'|[^,()\[\]{}]+)", line))


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123", "hf_abcdefghijklmnopqrstuvwxyz123"),
        ("Authorization: Bearer abc.def-123456789", "abc.def-123456789"),
        ('{"Authorization": "Bearer abc"}', "abc"),
        ("{'authorization': 'Basic dXNlcjpwYXNz'}", "dXNlcjpwYXNz"),
        ("ExecStart=/x -m sglang.launch_server --api-key sk-secret123 --port 1", "sk-secret123"),
        ("--api-key=topsecretvalue", "topsecretvalue"),
        ("python -m sglang.launch_server --admin-api-key 'adm1n key' --port 1", "adm1n key"),
        ("--hf-token hf_short1 --max-prefill-tokens 16384", "hf_short1"),
        # argv lists as SGLang and Python log them
        ("Launching: ['python3', '-m', 'sglang.launch_server', '--api-key', 'abc', '--port', '30001']", "abc"),
        ('argv=["--model-path", "/m", "--api-key", "k3y-in-json"]', "k3y-in-json"),
        ("['--api-key=abcdef', '--port', '1']", "abcdef"),
        # SGLang's ServerArgs repr
        ("server_args=ServerArgs(api_key='k3y-value', port=1)", "k3y-value"),
        ("ServerArgs(admin_api_key='adminpass', ssl_keyfile_password='pem-pass')", "adminpass"),
        ("ServerArgs(admin_api_key='adminpass', ssl_keyfile_password='pem-pass')", "pem-pass"),
        ('{"api_key": "zzzzzz"}', "zzzzzz"),
        ("token sk-proj-ABCDEFGHIJKLMNOPQRSTUV in a log", "sk-proj-ABCDEFGHIJKLMNOPQRSTUV"),
        ("password=hunter2", "hunter2"),
        ("DB_PASSWORD=12345", "12345"),  # a numeric password is still a password
        # environment variables holding strings
        ("Environment=OPENAI_API_KEY=foo-bar-baz", "foo-bar-baz"),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("export AZURE_CLIENT_SECRET='a~b.c-d_e'", "a~b.c-d_e"),
        ("MLFLOW_TRACKING_PASSWORD=mlflowpw SOME_PASSWORD_FILE_CONTENT=abc", "mlflowpw"),
        ("GITHUB_TOKEN=abcdef12345 HF_HUB_OFFLINE=1", "abcdef12345"),
        ('Environment="WANDB_API_KEY=0123456789abcdef"', "0123456789abcdef"),
        ("my_service_token: s3cr3t-t0k3n", "s3cr3t-t0k3n"),
        # a systemd unit's Environment= as `systemctl show` prints it (the test host plants this one)
        ("Environment=PROBE_BEARER=muOqoujQT56fv2RLakq1NAIqKK5XcbbY7amPV2zI PYTHONUNBUFFERED=1",
         "muOqoujQT56fv2RLakq1NAIqKK5XcbbY7amPV2zI"),
        ("SESSION_COOKIE=abc123def456", "abc123def456"),
        # cloud keys
        ("using AKIAIOSFODNN7EXAMPLE for s3://bucket", "AKIAIOSFODNN7EXAMPLE"),
        ("ASIAY34FZKBOKMUTVV7A temporary", "ASIAY34FZKBOKMUTVV7A"),
        ("key=AIzaSyA-1234567890abcdefghijklmnopqrstu", "AIzaSyA-1234567890abcdefghijklmnopqrstu"),
        ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0a2V5PT0=;EndpointSuffix=core",
         "c2VjcmV0a2V5PT0="),
        ("GET https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=Zm9vYmFy%3D&se=2026", "Zm9vYmFy%3D"),
        ("https://b.s3.amazonaws.com/k?X-Amz-Signature=abcdef0123&X-Amz-Date=1", "abcdef0123"),
        ('{"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\n-----END PRIVATE KEY-----\\n"}',
         "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
        ("Authorization: Bearer ya29.a0AfH6SMBx-abcdefghijklmnopqrstuvwxyz", "ya29.a0AfH6SMBx"),
        # other well-known token shapes
        ("cloning with ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "dozjgNryP4J3jVmNHl0w5N"),
        ("anthropic sk-ant-api03-abcdefghijklmnop_qrst", "sk-ant-api03-abcdefghijklmnop_qrst"),
        # passwords in URLs
        ("http://admin:pa55word@10.0.0.1:8080/v1", "pa55word"),
        ("redis://:redispw@cache:6379/0", "redispw"),
        ("postgresql://svc:p%40ss@db/x?sslmode=require", "p%40ss"),
        # a token as the whole userinfo of an HTTP URL, and secrets in a URL's query (numbers too)
        ("attached http://sk-abc123secret@127.0.0.1:30000/v1 ok", "sk-abc123secret"),
        ("git clone https://ghs_shorttok@github.example/x.git", "ghs_shorttok"),
        ("wss://Tok3n@gw:443/stream", "Tok3n"),
        ("GET http://h:1/v1/models?key=XYZ12345", "XYZ12345"),
        ("GET http://h:1/v1/models?a=1&key=XYZ12345&b=2", "XYZ12345"),
        ("http://h:1/?token=12345678", "12345678"),
        ("http://h:1/?access_token=abcd1234", "abcd1234"),
        ("http://h:1/?api_key=abcd1234", "abcd1234"),
        ("http://h:1/?apikey=abcd1234", "abcd1234"),
    ],
)
def test_secrets_are_masked(text: str, secret: str) -> None:
    clean = redact(text)
    assert secret not in clean, clean
    assert MASK in clean


@pytest.mark.parametrize(
    "text",
    [
        '"completion_tokens":32,"prompt_tokens":4',
        "max_new_tokens=64, stop_token_ids=[1, 2]",
        '"eos_token": "<|im_end|>"',
        "Decode batch, #running-req: 1, #token: 64, accept len: 1.00",
        "Prefill batch, #new-seq: 1, #new-token: 3, #cached-token: 1, #pending-token: 0",
        # SGLang settings whose names contain "token" or "key": numbers and None, not credentials
        "bucket_time_to_first_token=None, kt_max_deferred_experts_per_token=None",
        "max_prefill_tokens=16384, num_reserved_decode_tokens=512, speculative_num_draft_tokens=16",
        "api_key=None, admin_api_key=None, ssl_keyfile_password=None, ssl_keyfile=None",
        "--bucket-time-to-first-token 0.1 0.5 --max-prefill-tokens 16384 --speculative-num-draft-tokens 8",
        "kt_max_deferred_experts_per_token=4 first_token: 12.5",
        "tokenizer_path='/tmp/models/target', skip_tokenizer_init=False, speculative_token_map=None",
        # where a secret lives is not the secret; an absent one is evidence
        'api_key_env = "DFLASH_API_KEY" HF_TOKEN_PATH=/root/.cache/hf/token PWD=/home/sre',
        "HF_TOKEN= OPENAI_API_KEY='' AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY}",
        "Authorization header missing: 401",
        "the sampled request took 84 s; first token at 0.2 s",
        # an ssh user is a user; query parameters that only look like secrets stay
        "ssh://deploy@gpu-07:22?timeout=4 and root@gpu-07",
        "GET /generate?max_tokens=5&stream=true&eos_token_id=2",
        "Tom & Jerry=friends, a?b=c",
    ],
)
def test_harmless_text_stays_visible(text: str) -> None:
    assert redact(text) == text


def test_known_literal_secrets_are_masked_anywhere() -> None:
    assert "s3cr3t-value" not in redact("echo s3cr3t-value", extra=("s3cr3t-value",))


def test_remembered_secrets_are_masked_in_every_later_call() -> None:
    remember("r3m3mb3red-k3y-0001", None, "")
    assert redact("plain text mentioning r3m3mb3red-k3y-0001 twice: r3m3mb3red-k3y-0001") == (
        f"plain text mentioning {MASK} twice: {MASK}")


def test_a_text_redacted_before_a_secret_was_remembered_is_masked_after() -> None:
    """Short texts are memoized: remembering a secret must not leave the earlier, unmasked answer in use."""
    text = "service url http://127.0.0.1:30001 key l4t3-l34rn3d-0002"
    assert redact(text) == text
    remember("l4t3-l34rn3d-0002")
    assert redact(text) == f"service url http://127.0.0.1:30001 key {MASK}"
    assert redact(text, extra=("30001",)) == f"service url http://127.0.0.1:{MASK} key {MASK}"  # its own answer


def test_is_secret_tells_a_key_from_a_setting() -> None:
    assert is_secret("--api-key", "abc") and is_secret("HF_TOKEN", "hf_x") and is_secret("DB_PASSWORD", "1234")
    assert not is_secret("--max-prefill-tokens", "16384") and not is_secret("api_key", "None")
    assert not is_secret("--port", "30001") and not is_secret("bucket_time_to_first_token", "0.1")


@pytest.mark.parametrize(
    ("key", "value", "masked"),
    [
        ("AWS_SECRET_ACCESS_KEY", "abc", True),
        ("HF_TOKEN", "hf_abc", True),
        ("db_password", 12345, True),
        ("api_key", None, False),
        ("max_prefill_tokens", 16384, False),
        ("first_token_s", 0.2, False),
        ("bucket_time_to_first_token", None, False),
        ("model", "Qwen3-8B", False),
    ],
)
def test_mapping_values_are_masked_by_their_key(key: str, value: object, masked: bool) -> None:
    assert (redact_mapping_value(key, value) == MASK) is masked


def test_the_real_server_args_line_keeps_every_setting() -> None:
    line = server_args_line()
    assert redact(line) == line  # no secret in it: nothing may change, not one harmless setting
    before = settings(line)
    for name in ("bucket_time_to_first_token", "kt_max_deferred_experts_per_token", "max_prefill_tokens",
                 "num_reserved_decode_tokens", "api_key", "admin_api_key", "ssl_keyfile_password",
                 "speculative_num_draft_tokens"):
        assert name in before, name  # the recording has them: the test checks real settings
    assert before["api_key"] == "None" and before["max_prefill_tokens"] == "16384"
    assert len(before) > 300


def test_a_secret_planted_in_the_real_server_args_line_is_hidden_and_nothing_else_changes() -> None:
    line = server_args_line()
    planted = (line.replace("api_key=None", "api_key='sk-planted-0123456789abcdef'", 1)
               .replace("admin_api_key=None", "admin_api_key='adm-planted-9876'", 1)
               .replace("ssl_keyfile_password=None", "ssl_keyfile_password='pem-planted'", 1))
    assert planted.count("planted") == 3
    clean = redact(planted)
    assert "planted" not in clean
    before, after = settings(planted), settings(clean)
    changed = {name for name in before if before[name] != after.get(name)}
    assert changed == {"api_key", "admin_api_key", "ssl_keyfile_password"}, changed
    assert after["api_key"] == f"'{MASK}'"
    assert after["bucket_time_to_first_token"] == "None" and after["num_reserved_decode_tokens"] == "512"
    # and as an argv list and an environment dump in the same log
    argv = "['python3', '-m', 'sglang.launch_server', '--api-key', 'sk-planted-0123456789abcdef', '--port', '30001']"
    env = "HF_TOKEN=hf_plantedplantedplantedplanted AWS_SECRET_ACCESS_KEY=planted/aws+secret HF_HUB_OFFLINE=1"
    clean = redact(f"{argv}\n{env}\n{planted}")
    assert "planted" not in clean
    assert "'--port', '30001'" in clean and "HF_HUB_OFFLINE=1" in clean


@pytest.mark.parametrize(("text", "password"), [
    ("ssh://root:p@ssw0rd@10.0.0.1:22", "ssw0rd"),  # urllib reads the userinfo up to the LAST '@'
    ("connect to http://user:a@b@c@host:80/v1 now", "b@c"),
    ("redis://:s3cr3t@cache:6379/0", "s3cr3t"),
])
def test_a_url_password_holding_at_signs_is_masked_whole(text: str, password: str) -> None:
    masked = redact(text)
    assert password not in masked and MASK in masked, masked
    assert masked.split(MASK)[1].startswith("@"), masked  # the host stays visible


@pytest.mark.parametrize(("url", "shown"), [
    ("ssh://root:pa'ss\"w@10.0.0.1:22?timeout=4", f"ssh://root:{MASK}@10.0.0.1:22?timeout=4"),
    ("http://user:p@ss@h:1/v1?x=1", f"http://user:{MASK}@h:1/v1?x=1"),
    ("http://10.0.0.1:30000", "http://10.0.0.1:30000"),
    ("local://", "local://"),
    ("http://h:1/?api_key=abcdefgh", f"http://h:1/?api_key={MASK}"),
    ("http://u:pw@[::1", f"http://u:{MASK}@[::1"),  # malformed: the text rules still mask it
    ("http://sk-abc123secret@127.0.0.1:30000", f"http://{MASK}@127.0.0.1:30000"),
    ("https://h:1/v1?key=12345678&x=1", f"https://h:1/v1?key={MASK}&x=1"),
    ("ssh://deploy@gpu-07:22?timeout=4", "ssh://deploy@gpu-07:22?timeout=4"),
])
def test_redact_url_masks_the_password_as_urllib_reads_it(url: str, shown: str) -> None:
    from pytest_dflash.scrub.redact import redact_url

    assert redact_url(url) == shown


def test_mask_url_passwords_masks_every_credential_of_a_url_and_no_word() -> None:
    """Input errors quote a profile's values: a URL's credentials go, words naming secrets stay."""
    from pytest_dflash.scrub.redact import mask_url_passwords

    line = ("a.toml: services.a.password: unknown key; url 'http://sk-abc123secret@h:1/?token=12345678', "
            "connection 'ssh://root:pw@h'")
    assert mask_url_passwords(line) == (f"a.toml: services.a.password: unknown key; url 'http://{MASK}@h:1/"
                                        f"?token={MASK}', connection 'ssh://root:{MASK}@h'")


def test_one_line_escapes_control_characters() -> None:
    from pytest_dflash.scrub.redact import one_line

    assert one_line("a\nb\tc\x1b[2J\u2028d é") == "a\\nb\\tc\\x1b[2J\\u2028d é"


SECRETISH = tomllib.loads((ROOT / "tests" / "data" / "sglang-versions" / "secretish-flags-0.5.23.toml")
                          .read_text())["flag"]
SAMPLE = {"Optional[str]": ["planted-value-1234"], "str": ["planted-value-1234"], "int": ["16384"],
          "Optional[int]": ["16384"], "float": ["0.5"], "Optional[float]": ["0.5"],
          "Optional[List[float]]": ["0.1", "0.5"], "Optional[List[str]]": ["planted-a", "planted-b"], "bool": []}


@pytest.mark.parametrize("row", SECRETISH, ids=[row["flag"] for row in SECRETISH])
def test_redact_argv_masks_the_credentials_of_sglang_and_nothing_else(row: dict[str, object]) -> None:
    """Every sglang 0.5.23 flag whose name holds key / token / secret / password, with a value of its declared
    type, in both spellings: only --api-key, --admin-api-key and --ssl-keyfile-password lose their value."""
    flag, values = str(row["flag"]), SAMPLE[str(row["type"])]
    argv = ["--model-path", "/m", flag, *values, "--port", "30000"]
    shown = redact_argv(argv)
    assert shown == (["--model-path", "/m", flag, MASK, "--port", "30000"] if row["secret"] else argv)
    if values:
        inline = redact_argv([f"{flag}={values[0]}"])
        assert inline == [f"{flag}={MASK}" if row["secret"] else f"{flag}={values[0]}"]


def test_redact_argv_keeps_what_says_there_is_no_secret_and_masks_urls_and_known_shapes() -> None:
    argv = ["--api-key", "None", "--hf-token", "hf_abcdefghijklmnopqrstuvwx", "--watermark-config", "<redacted>",
            "--model-path", "https://user:pw-1234@hub.example/m", "--admin-api-key", "--enable-metrics"]
    assert redact_argv(argv) == ["--api-key", "None", "--hf-token", MASK, "--watermark-config", "<redacted>",
                                 "--model-path", f"https://user:{MASK}@hub.example/m", "--admin-api-key",
                                 "--enable-metrics"]
