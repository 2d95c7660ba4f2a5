"""One per-topic config table: the controller (CreateTopics) and the broker's storage
(LogConfig) accept and refuse the same names and values (issue 14, item 3)."""

from __future__ import annotations

import pytest

from broker.storage.log_config import LogConfig
from controller.topic_validation import InvalidTopicConfig
from controller.topic_validation import validate_topic_configs
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.topic_configs import INT64_MAX
from protocol.topic_configs import LOG_CONFIGS
from protocol.topic_configs import TOPIC_CONFIGS


async def test_a_topic_config_the_broker_applies_is_accepted_by_the_controller(harness) -> None:
    """`topic create -c index.interval.bytes=512` was refused with INVALID_CONFIG by the
    controller although every broker applies index.interval.bytes."""
    await harness.start_broker(1)
    response = await harness.handlers.create_topics(
        CreateTopicsRequest(
            topics=[CreatableTopic(name="indexed", configs={"index.interval.bytes": "512"})]
        )
    )
    (result,) = response.topics
    assert result.error_code == ErrorCode.NONE, result.error_message
    topic = harness.image.topic_by_name("indexed")
    assert topic is not None
    stored = topic.configs
    assert stored["index.interval.bytes"] == "512"
    assert LogConfig.from_topic_configs(stored).index_interval_bytes == 512


VALUES = ["ten", "1.5", "", "-2", "-1", "0", "1", "13", "14", "4096", str(2**31 - 1)]
VALUES += [str(2**31), str(INT64_MAX), str(2**63), "true", "FALSE"]


@pytest.mark.parametrize("name", sorted(LOG_CONFIGS))
@pytest.mark.parametrize("value", VALUES)
def test_controller_and_broker_agree_on_every_storage_config_value(name: str, value: str) -> None:
    """A value the controller stores is one every broker can apply, and a value the
    broker would refuse never reaches it."""
    try:
        stored = validate_topic_configs(
            {name: value}, default_min_insync_replicas=1, default_unclean_leader_election=False
        )
    except InvalidTopicConfig as refused:
        with pytest.raises(ValueError) as broker_refused:
            LogConfig.from_topic_configs({name: value})
        assert str(broker_refused.value) == str(refused)
    else:
        LogConfig.from_topic_configs(stored)
        LogConfig.from_topic_configs({name: value})


def test_every_topic_config_names_its_bounds_in_the_error() -> None:
    for definition in TOPIC_CONFIGS.values():
        with pytest.raises(InvalidTopicConfig) as info:
            validate_topic_configs(
                {definition.name: "not-a-value"},
                default_min_insync_replicas=1,
                default_unclean_leader_election=False,
            )
        message = str(info.value)
        assert definition.name in message and "'not-a-value'" in message
        assert definition.valid_values.split(",")[0] in message
