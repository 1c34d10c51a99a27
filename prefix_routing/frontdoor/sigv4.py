"""Calling the front door from an HTTP client: SigV4 for its Function URL, as an ``httpx`` auth.

The ``openai`` SDK (and anything else built on ``httpx`` or its successor ``httpx2``) takes it as the
``auth`` of the client it is given, so application developers keep the client they already hold::

    import httpx2  # what openai 3.x is built on; httpx.Client(auth=...) takes the same auth
    from openai import OpenAI
    from prefix_routing.frontdoor.sigv4 import FunctionUrlAuth

    client = OpenAI(base_url="https://<url-id>.lambda-url.us-east-1.on.aws/v1", api_key="unused",
                    http_client=httpx2.Client(auth=FunctionUrlAuth(region="us-east-1"), timeout=130))
    for chunk in client.chat.completions.create(model="default", messages=[...], stream=True,
                                                stream_options={"include_usage": True}):
        ...

Each request is signed with botocore's own signer (service ``lambda``), with the credentials of the
default chain (or a ``boto3``/``botocore`` session's), over its method, URL, headers and body; any
``Authorization`` the client set (the SDK's bearer key) is replaced. The auth is a plain callable,
so it needs neither ``httpx`` nor ``httpx2`` to import, and it signs every retry afresh.
"""

from __future__ import annotations

from typing import Any

#: Headers a proxy or the client library may change after signing: never signed.
_UNSIGNED = frozenset({"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256",
                       "content-length", "connection", "accept-encoding", "user-agent", "expect"})


class FunctionUrlAuth:
    """An ``httpx``/``httpx2`` auth that signs each request with SigV4 for a Lambda Function URL.

    ``region`` is the function's region (required: a Function URL's host does not say it in a form
    botocore reads). ``session`` is a ``botocore.session.Session`` or ``boto3.session.Session``
    (default: a new botocore session: environment, profile, instance or container credentials).
    ``service`` is ``lambda`` for Function URLs.
    """

    def __init__(self, *, region: str, session: Any = None, service: str = "lambda") -> None:
        if not isinstance(region, str) or not region:
            raise ValueError("region: the Function URL's AWS region, e.g. us-east-1")
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        if session is None:
            import botocore.session

            session = botocore.session.Session()
        self._session = session
        self._signer, self._request = SigV4Auth, AWSRequest
        self.region = region
        self.service = service

    def _credentials(self) -> Any:
        credentials = self._session.get_credentials()
        if credentials is None:
            raise RuntimeError("no AWS credentials found to sign the Function URL request (SigV4)")
        return credentials.get_frozen_credentials()

    def __call__(self, request: Any) -> Any:
        """Sign ``request`` (an ``httpx``/``httpx2`` request) in place and return it."""
        body = request.read()  # the SDK's JSON body is in memory: signing needs its hash
        headers = {name: value for name, value in request.headers.items() if name.lower() not in _UNSIGNED}
        signed = self._request(method=request.method, url=str(request.url), data=body, headers=headers)
        self._signer(self._credentials(), self.service, self.region).add_auth(signed)
        for name in ("authorization", "x-amz-date", "x-amz-security-token"):
            if name in request.headers:
                del request.headers[name]
        for name, value in signed.headers.items():
            if name.lower() in ("authorization", "x-amz-date", "x-amz-security-token"):
                request.headers[name] = value
        return request
