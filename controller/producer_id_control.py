"""Producer ids (Kafka's ProducerIdControlManager): blocks of ids handed to brokers,
each block durable before it is answered (KIP-730)."""

from __future__ import annotations

import logging

from controller.context import ControllerPart
from controller.epochs import stale_broker_epoch
from controller.state import MetadataImage
from protocol.errors import ErrorCode
from protocol.messages import AllocateProducerIdsRequest
from protocol.messages import AllocateProducerIdsResponse
from protocol.metadata_records import MetadataRecord
from protocol.metadata_records import ProducerIdsRecord

log = logging.getLogger(__name__)

# Producer ids handed to a broker per AllocateProducerIds (Kafka's block size).
PRODUCER_ID_BLOCK_SIZE = 1000


class ProducerIdControl(ControllerPart):
    async def allocate_producer_ids(
        self, request: AllocateProducerIdsRequest
    ) -> AllocateProducerIdsResponse:
        """KIP-730: the next block of producer ids, made durable before it is answered,
        so no id is handed out twice, even across a controller restart."""

        def build(
            image: MetadataImage,
        ) -> tuple[list[MetadataRecord], AllocateProducerIdsResponse]:
            stale = stale_broker_epoch(image.brokers, request.broker_id, request.broker_epoch)
            if stale is not None:
                return [], AllocateProducerIdsResponse(
                    error_code=int(ErrorCode.STALE_BROKER_EPOCH), error_message=stale
                )
            start = image.next_producer_id
            record = ProducerIdsRecord(
                broker_id=request.broker_id,
                broker_epoch=request.broker_epoch,
                next_producer_id=start + PRODUCER_ID_BLOCK_SIZE,
            )
            return [record], AllocateProducerIdsResponse(
                producer_id_start=start, producer_id_len=PRODUCER_ID_BLOCK_SIZE
            )

        response = await self.writer.commit(build)
        if response.error_code == 0:
            log.info(
                "broker %d epoch %d: producer ids [%d, %d) allocated",
                request.broker_id,
                request.broker_epoch,
                response.producer_id_start,
                response.producer_id_start + response.producer_id_len,
            )
        return response
