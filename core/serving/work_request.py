"""The one reader of `pdserve.v1.WorkRequest` on the workers (Reserve, GenerateLocal, Prefill).

The router validated the request at its door (router/validation.py) and is these services' only
client, so the workers trust what it checked there (the prompt's text, stop strings' limits, the
context length against the model); what they still check, they check because their engine does
for every caller, the offline API's included (token ids in the vocabulary, sampling values, what
fits this worker's pool): one InvalidRequestError naming the field, as at the router.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pdserve.core.sampling_params import DEFAULT_TENANT, SamplingParams
from pdserve.core.serving.sampling_proto import sampling_from_proto
from pdserve.v1 import common_pb2


@dataclass(frozen=True)
class WorkRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    resumed_output_token_ids: list[int]


def work_from_proto(message: common_pb2.WorkRequest) -> WorkRequest:
    params = replace(  # a weight <= 0 or NaN is refused naming `tenant_weight`
        sampling_from_proto(message.sampling, message.priority),
        tenant=message.tenant or DEFAULT_TENANT,
        tenant_weight=message.tenant_weight or 1.0,
    )
    return WorkRequest(
        request_id=message.request_id,
        prompt_token_ids=list(message.prompt_token_ids),
        params=params,
        resumed_output_token_ids=list(message.resumed_output_token_ids),
    )
