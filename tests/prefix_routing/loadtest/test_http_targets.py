

def test_a_local_caller_is_named_by_its_access_key_id():
    from prefix_routing.loadtest import LambdaUrlTarget

    target = LambdaUrlTarget.local_caller("http://127.0.0.1:9/", "tenant-a")
    authorization = target.request_headers(b"{}")["Authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=tenant-a/")
    assert "/us-east-1/lambda/aws4_request" in authorization
