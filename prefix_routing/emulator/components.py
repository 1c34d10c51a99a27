"""Several inference components on one emulated endpoint: a stage's trust domains.

Each component is a backend of its own (the fleet model's copies, or engines of its own), so two
components never share a KV cache, as two SageMaker inference components never do. A request goes
to the backend its ``InferenceComponentName`` names; a name the endpoint does not host gets
SageMaker's ``ValidationError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefix_routing.emulator.backend import Backend, BackendResponse, ErrorReply
from prefix_routing.emulator.protocol import RuntimeRequest


def served_model(config: Any) -> str:
    """The model id the stage's endpoint answers to on the OpenAI path (its ``/v1/models`` entry): the
    Hugging Face id the container loads, else the S3 location of the weights."""
    return config.model.model_id or config.model.model_s3_uri


class ComponentBackends:
    """``backends``: component name → its backend, the primary component's first. ``status()`` is the
    primary's, with every component's under ``components``."""

    def __init__(self, backends: Mapping[str, Backend]) -> None:
        if not backends:
            raise ValueError("ComponentBackends: at least one component")
        self.backends = dict(backends)
        self.primary = next(iter(self.backends))

    def handle(self, request: RuntimeRequest) -> BackendResponse | ErrorReply:
        name = request.headers.inference_component
        backend = self.backends.get(name)
        if backend is None:
            return ErrorReply("ValidationError", f"Inference Component {name} does not exist.")
        return backend.handle(request)

    def status(self) -> dict[str, Any]:
        statuses = {name: _status(backend) for name, backend in self.backends.items()}
        return {**statuses[self.primary], "components": statuses}

    def close(self) -> None:
        for backend in self.backends.values():
            close = getattr(backend, "close", None)
            if callable(close):
                close()


def _status(backend: Backend) -> dict[str, Any]:
    status = getattr(backend, "status", None)
    return status() if callable(status) else {}
