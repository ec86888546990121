"""The version a response carries: formatted by the gateway, parsed back by clients, one module."""

import pytest

from clawrl.policy_version import (
    fingerprint,
    parse_fingerprint,
    parse_version_fields,
    version_fields,
)


@pytest.mark.parametrize("version", [0, 1, 17, 10_000])
def test_round_trip(version):
    assert parse_fingerprint(fingerprint(version)) == version
    assert parse_version_fields(version_fields(version)) == version


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "fp_44709d6fcb",
        "clawrl-policy-v",
        "clawrl-policy-v-1",
        "clawrl-policy-v1a",
        "clawrl-policy-v١",
        3,
    ],
)
def test_anything_else_is_no_version(value):
    assert parse_fingerprint(value) is None


def test_fields_refuse_non_versions():
    assert parse_version_fields({}) is None
    assert parse_version_fields({"policy_version": True}) is None
    assert parse_version_fields({"policy_version": -2}) is None
    with pytest.raises(ValueError):
        fingerprint(-1)
