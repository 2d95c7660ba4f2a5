"""The one table of served APIs (controller/handlers.py) drives both the dispatch and
the ApiVersions answer: every served API has a handler, and ApiVersions lists exactly
the table (FaultControl only with --enable-test-faults)."""

from __future__ import annotations

import inspect
from pathlib import Path

from controller.handlers import SERVED_APIS
from protocol.api import ApiKey
from protocol.messages import API_SPECS
from protocol.messages import ApiVersionsRequest


async def test_every_served_api_has_a_handler_and_api_versions_lists_the_table(
    make_harness, tmp_path: Path
) -> None:
    for enable_test_faults in (False, True):
        h = await make_harness(
            tmp_path / str(enable_test_faults), enable_test_faults=enable_test_faults
        )
        expected = [
            int(key)
            for key, api in SERVED_APIS.items()
            if enable_test_faults or not api.test_faults_only
        ]
        for key in expected:
            handler = h.handlers.handlers[key]
            assert handler == getattr(h.handlers, SERVED_APIS[ApiKey(key)].handler)
            assert inspect.iscoroutinefunction(handler), key
        assert list(h.handlers.handlers) == expected
        versions = await h.handlers.api_versions(ApiVersionsRequest())
        assert [v.api_key for v in versions.api_keys] == expected
        for v in versions.api_keys:
            spec = API_SPECS[ApiKey(v.api_key)]
            assert (v.min_version, v.max_version) == (spec.min_version, spec.max_version)
    assert int(ApiKey.FAULT_CONTROL) in {
        int(k) for k, a in SERVED_APIS.items() if a.test_faults_only
    }
