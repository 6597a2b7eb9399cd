"""Every built-in address-full policy passes the full policy conformance suite."""

from __future__ import annotations

from scow.core.conformance.full_policy import FullPolicyConformance


class TestDropPolicy(FullPolicyConformance):
    full_policy = "DROP"


class TestFailPolicy(FullPolicyConformance):
    full_policy = "FAIL"


class TestBlockPolicy(FullPolicyConformance):
    full_policy = "BLOCK"


class TestPagePolicy(FullPolicyConformance):
    full_policy = "PAGE"
