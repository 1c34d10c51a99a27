"""SigV4 for the Function URL as an httpx/httpx2 auth (prefix_routing.frontdoor.sigv4).

The signature is checked by an independent implementation of AWS Signature Version 4 (the
algorithm as AWS documents it: canonical request, string to sign, derived key), over the request
exactly as the client sends it, so a header changed after signing would fail here as it fails at AWS.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote, urlsplit

import httpx2
import pytest
from botocore.credentials import Credentials

from prefix_routing.frontdoor.sigv4 import FunctionUrlAuth

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


class _Session:
    def __init__(self, token: str | None = None) -> None:
        self.credentials = Credentials("AKIDEXAMPLE", SECRET, token)

    def get_credentials(self):
        return self.credentials


def _expected_signature(request: httpx2.Request, region: str, service: str) -> str:
    authorization = request.headers["authorization"]
    signed_headers = authorization.split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
    amz_date = request.headers["x-amz-date"]
    url = urlsplit(str(request.url))
    canonical_headers = "".join(f"{name}:{' '.join(request.headers[name].split())}\n" for name in signed_headers)
    canonical = "\n".join([request.method, quote(url.path or "/", safe="/~"), url.query, canonical_headers,
                           ";".join(signed_headers), hashlib.sha256(request.content).hexdigest()])
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + SECRET).encode()
    for part in (amz_date[:8], region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _signed(auth: FunctionUrlAuth) -> httpx2.Request:
    request = httpx2.Request("POST", "https://abc.lambda-url.eu-west-1.on.aws/v1/chat/completions",
                             headers={"authorization": "Bearer sk-the-sdks-own", "content-type": "application/json",
                                      "x-stainless-retry-count": "0"},
                             content=b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}')
    return auth(request)


def test_the_request_carries_a_valid_sigv4_signature_for_lambda_in_its_region():
    request = _signed(FunctionUrlAuth(region="eu-west-1", session=_Session()))
    authorization = request.headers["authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/lambda/aws4_request" in authorization and "Bearer" not in authorization
    signed = authorization.split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
    assert {"host", "content-type", "x-amz-date", "x-stainless-retry-count"} <= set(signed)
    assert authorization.rsplit("Signature=", 1)[1] == _expected_signature(request, "eu-west-1", "lambda")


def test_temporary_credentials_add_their_session_token():
    request = _signed(FunctionUrlAuth(region="us-east-1", session=_Session(token="session-token")))
    assert request.headers["x-amz-security-token"] == "session-token"
    assert request.headers["authorization"].rsplit("Signature=", 1)[1] == _expected_signature(
        request, "us-east-1", "lambda")


def test_a_region_is_required_and_missing_credentials_are_said():
    with pytest.raises(ValueError, match="region"):
        FunctionUrlAuth(region="")

    class _Empty:
        def get_credentials(self):
            return None

    with pytest.raises(RuntimeError, match="no AWS credentials"):
        _signed(FunctionUrlAuth(region="us-east-1", session=_Empty()))
