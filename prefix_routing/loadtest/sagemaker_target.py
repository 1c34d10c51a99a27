"""The ``sagemaker`` target: boto3's ``InvokeEndpointWithResponseStream``, against AWS or the emulator."""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import urlsplit

from prefix_routing.emulator.server import is_loopback_host
from prefix_routing.loadtest.stream import (
    Attempt,
    StreamParser,
    classify_http,
    describe_error,
    exception_kind,
    expects_usage,
)
from prefix_routing.rules.errors import UserError

TARGETS = ("sagemaker", "lambda-url", "openai")


def _is_loopback_url(url: str | None) -> bool:
    return bool(url) and is_loopback_host(urlsplit(url).hostname or "")


class SageMakerTarget:
    """``InvokeEndpointWithResponseStream`` through boto3 (or the emulator with ``endpoint_url``)."""

    name = "sagemaker"

    def __init__(
        self,
        endpoint_name: str,
        *,
        inference_component: str | None = None,
        prefix_aware_id: str | None = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        timeout: float = 120.0,
        concurrency: int = 8,
        content_type: str = "application/json",
        custom_attributes: str | None = None,
        client: Any = None,
    ):
        if not endpoint_name:
            raise UserError("the sagemaker target needs --endpoint NAME")
        self.endpoint_name = endpoint_name
        self.params: dict[str, Any] = {"EndpointName": endpoint_name, "ContentType": content_type}
        if inference_component:
            self.params["InferenceComponentName"] = inference_component
        if prefix_aware_id:
            self.params["PrefixAwareId"] = prefix_aware_id
        if custom_attributes:
            self.params["CustomAttributes"] = custom_attributes
        self.description = f"sagemaker endpoint {endpoint_name}" + (
            f" component {inference_component}" if inference_component else ""
        ) + (f" at {endpoint_url}" if endpoint_url else "")
        self._local = threading.local()
        if client is not None:
            self.client = client
            self._register()
            return
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ProfileNotFound
        except ImportError as error:  # pragma: no cover - boto3 is a dependency
            raise UserError(f"the sagemaker target needs boto3: {error}") from None
        local = _is_loopback_url(endpoint_url)
        try:
            session = boto3.Session(profile_name=profile) if profile else boto3.Session()
        except ProfileNotFound as error:
            raise UserError(str(error)) from None
        region = region or session.region_name or ("us-east-1" if local else None)
        if not region:
            raise UserError("the sagemaker target needs --region (or AWS_REGION / a profile with a region)")
        credentials = session.get_credentials()
        extra: dict[str, Any] = {}
        if credentials is None:
            if not local:
                raise UserError("no AWS credentials found for the sagemaker target (environment, profile or role)")
            extra = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=min(10.0, timeout),
            read_timeout=timeout,
            max_pool_connections=max(10, concurrency + 2),
            tcp_keepalive=True,
        )
        try:
            self.client = session.client(
                "sagemaker-runtime", region_name=region, endpoint_url=endpoint_url, config=config, **extra
            )
        except (BotoCoreError, ValueError) as error:
            raise UserError(f"cannot make the sagemaker-runtime client: {error}") from None
        model = self.client.meta.service_model.operation_model("InvokeEndpointWithResponseStream")
        if prefix_aware_id and "PrefixAwareId" not in model.input_shape.members:
            raise UserError("this botocore has no PrefixAwareId parameter; upgrade boto3/botocore")
        self._register()

    def _register(self) -> None:
        # The clock starts when botocore hands the signed request to the HTTP layer (its own
        # request building is reported as client_overhead_s), like the HTTP targets' clocks.
        events = getattr(getattr(self.client, "meta", None), "events", None)
        if events is not None:
            events.register("before-send.sagemaker-runtime.InvokeEndpointWithResponseStream", self._on_send)

    def _on_send(self, **kwargs: Any) -> None:
        self._local.sent = time.perf_counter()
        return None

    def send(self, body: bytes) -> Attempt:
        from botocore.exceptions import ClientError, ParamValidationError

        attempt = Attempt()
        parser = StreamParser()
        expect_usage = expects_usage(body)
        self._local.sent = None
        call_start = start = time.perf_counter()
        response = None
        try:
            try:
                try:
                    response = self.client.invoke_endpoint_with_response_stream(Body=body, **self.params)
                finally:
                    start = self._local.sent or call_start
                    attempt.client_overhead_s = start - call_start
            except ClientError as error:
                meta = error.response.get("ResponseMetadata", {})
                info = error.response.get("Error", {})
                attempt.status = meta.get("HTTPStatusCode")
                attempt.request_id = meta.get("RequestId")
                attempt.kind = classify_http(attempt.status or 0, info.get("Code"))
                attempt.detail = f"{info.get('Code', 'error')}: {info.get('Message', '')}".strip()
                return attempt
            except ParamValidationError as error:
                attempt.kind, attempt.detail = "client_error", describe_error(error)
                return attempt
            meta = response.get("ResponseMetadata", {})
            attempt.status = meta.get("HTTPStatusCode")
            attempt.request_id = meta.get("RequestId")
            try:
                for event in response["Body"]:
                    part = event.get("PayloadPart")
                    if part is None:
                        continue
                    data = part.get("Bytes") or b""
                    if data and attempt.ttft_s is None:
                        attempt.ttft_s = time.perf_counter() - start
                    attempt.bytes_received += len(data)
                    parser.feed(data)
            except ClientError as error:  # EventStreamError: ModelStreamError / InternalStreamFailure
                info = error.response.get("Error", {})
                attempt.kind = "stream_error"
                attempt.detail = f"{info.get('Code', 'error')}: {info.get('Message', '')}".strip()
        except Exception as error:  # timeouts, dropped connections, refused connections
            attempt.kind, attempt.detail = exception_kind(error), describe_error(error)
        finally:
            attempt.e2e_s = time.perf_counter() - start
            if response is not None:
                try:
                    response["Body"].close()
                except Exception:
                    pass
        return attempt.finish(parser, expect_usage)

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if callable(close):
            close()
