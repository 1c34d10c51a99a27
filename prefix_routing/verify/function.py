"""The normalizer function as deployed, and (``--invoke``) one real round trip through its Function URL.

The round trip sends the same chat request twice, SigV4-signed with the operator's credentials
(the load tester's ``lambda-url`` target): tokens must stream back, the final usage must carry
``cached_tokens``, and the second request must report cached tokens > 0, which proves prefix
caching end to end. Then the function's log line for it must be in its log group with the fields
the saved Logs Insights queries and the Contributor Insights rules read.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField
from prefix_routing.stage.config import StageConfig
from prefix_routing.stage.web_adapter import LWA_LAYER_NAME
from prefix_routing.verify.deployment import error_code
from prefix_routing.verify.report import Check, fail, ok, unknown

#: Variables the function cannot run without (the front door's InvokeConfig.from_env and the adapter).
REQUIRED_ENVIRONMENT = ("ENDPOINT_NAME", "INFERENCE_COMPONENT_NAME", "TENANT_KEY_SECRET_ARN",
                        "AWS_LAMBDA_EXEC_WRAPPER", "AWS_LWA_INVOKE_MODE")
#: Fields of the request log line that the saved queries and the Contributor Insights rules read.
QUERIED_FIELDS = (LogField.MESSAGE, LogField.TENANT, LogField.PREFIX_FINGERPRINT, LogField.PROMPT_TOKENS,
                  LogField.CACHED_TOKENS, LogField.OUTPUT_TOKENS, LogField.TTFT_MS)
ADAPTER_LAYER = f":layer:{LWA_LAYER_NAME}:"
#: The principals IAM's policy simulator evaluates: roles and users (an account is not one principal).
SIMULATED_PRINCIPAL = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/")
#: The condition key that tells an invocation through the Function URL from a direct one.
VIA_URL_KEY = "lambda:InvokedViaFunctionUrl"
_SYSTEM = ("You are the verification assistant of a prefix-aware routing deployment. " * 40).strip()
VERIFY_BODY = json.dumps({"messages": [{"role": "system", "content": _SYSTEM},
                                       {"role": "user", "content": "Reply with the word ready."}],
                          "max_tokens": 8, "temperature": 0, "stream": True}).encode()


def stack_outputs(cloudformation: Any, stack: str) -> dict[str, str]:
    (described,) = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    return {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}


def check_function(lambda_client: Any, cloudformation: Any, config: StageConfig) -> tuple[list[Check], dict]:
    """The function's configuration; returns what ``--invoke`` needs (url, log group)."""
    stack = f"{config.stack_prefix}-Normalizer"
    try:
        outputs = stack_outputs(cloudformation, stack)
        name = outputs["FunctionName"]
    except Exception as error:  # noqa: BLE001
        return [fail(f"stack {stack}", f"no FunctionName output ({error_code(error)})",
                     f"deploy it: npx cdk deploy {stack} -c stage={config.name}")], {}
    title = f"function {name}"
    try:
        fn = lambda_client.get_function_configuration(FunctionName=name)
    except Exception as error:  # noqa: BLE001
        return [unknown(title, f"cannot read its configuration ({error_code(error)})",
                        "grant lambda:GetFunctionConfiguration")], {}
    env = (fn.get("Environment") or {}).get("Variables", {})
    problems = []
    if not str(fn.get("Runtime", "")).startswith("python3"):
        problems.append(f"runtime {fn.get('Runtime')}, not Python 3")
    if fn.get("Architectures") != ["arm64"]:
        problems.append(f"architectures {fn.get('Architectures')}, not ['arm64']")
    if not any(ADAPTER_LAYER in layer.get("Arn", "") for layer in fn.get("Layers", [])):
        problems.append("no Lambda Web Adapter layer (LambdaAdapterLayerArm64)")
    missing = [v for v in REQUIRED_ENVIRONMENT if v not in env]
    if missing:
        problems.append(f"environment lacks {', '.join(missing)}")
    names = (env.get("ENDPOINT_NAME"), env.get("INFERENCE_COMPONENT_NAME"))
    if not missing and names != (config.endpoint_name, config.component_name):
        problems.append(f"calls {names[0]} / {names[1]}, the stage is {config.endpoint_name} / {config.component_name}")
    domains = config.trust_domains()
    if not missing and env.get("DOMAINS") != (domains.to_json() if domains is not None else None):
        problems.append("its trust domains (DOMAINS) are not the stage's: tenants may reach another domain's copies")
    checks = [fail(title, "; ".join(problems), f"redeploy the normalizer stack: npx cdk deploy {stack} -c stage={config.name}")
              if problems else ok(title, f"{fn.get('Runtime')}, arm64, web adapter layer, environment complete")]
    log_group = (fn.get("LoggingConfig") or {}).get("LogGroup") or f"/aws/lambda/{name}"
    return checks, {"url": outputs.get("FunctionUrl"), "log_group": log_group, "arn": fn.get("FunctionArn")}


def check_invoke_principals(iam: Any, principals: list[str], function_arn: str | None) -> list[Check]:
    """Each of the stage's ``normalizer.invoke_principals`` that is a role or user, put to IAM's policy
    simulator: may it call ``lambda:InvokeFunction`` on the function with ``lambda:InvokedViaFunctionUrl``
    false, i.e. invoke it directly? Then it can send an event shaped like a Function URL's that names
    any tenant, which the function cannot tell from a real one: ✘. An account, or a simulator that
    cannot be called: ?."""
    checks = []
    for principal in principals:
        title = f"tenant principal {principal}"
        if not SIMULATED_PRINCIPAL.match(principal):
            checks.append(unknown(title, "an account: IAM's simulator evaluates one role or user, not an account",
                                  "in that account, give its roles lambda:InvokeFunction only with "
                                  f"{VIA_URL_KEY} (the policy TenantInvokePolicy holds), and run verify there"))
            continue
        if not function_arn:
            checks.append(unknown(title, "the function's ARN is unknown (its configuration could not be read)"))
            continue
        try:
            answer = iam.simulate_principal_policy(
                PolicySourceArn=principal, ActionNames=["lambda:InvokeFunction"], ResourceArns=[function_arn],
                ContextEntries=[{"ContextKeyName": VIA_URL_KEY, "ContextKeyValues": ["false"],
                                 "ContextKeyType": "boolean"}])
        except Exception as error:  # noqa: BLE001 - no permission, another account's role, throttling
            checks.append(unknown(title, f"IAM's policy simulator cannot be called ({error_code(error)})",
                                  "grant iam:SimulatePrincipalPolicy on it (another account's role: run verify with "
                                  "that account's credentials)"))
            continue
        decisions = [result.get("EvalDecision") for result in answer.get("EvaluationResults", [])]
        if "allowed" in decisions:
            checks.append(fail(title, "may call lambda:InvokeFunction on the function directly, not through its "
                               "Function URL: its events can name any tenant, and the function cannot tell them "
                               "from the URL's",
                               "replace its grants on the function by the stack's managed policy TenantInvokePolicy "
                               "(the output of that name): lambda:InvokeFunction only with "
                               f"{VIA_URL_KEY} = true"))
        else:
            checks.append(ok(title, "may invoke the function through its Function URL only"))
    return checks


def check_invocation(send: Callable[[bytes], Any], logs: Any, log_group: str, *, log_wait_s: float = 30.0,
                     sleep: Callable[[float], None] = time.sleep) -> list[Check]:
    """Two identical requests through the front door, then their log line.

    ``send(body)`` returns a load-tester ``Attempt`` (``ok``, ``output_tokens``, ``cached_tokens``,
    ``request_id``).
    """
    first, second = send(VERIFY_BODY), send(VERIFY_BODY)
    checks = []
    for label, attempt in (("first request", first), ("second request", second)):
        if not attempt.ok:
            checks.append(fail(f"invocation: {label}", f"{attempt.kind}: {attempt.detail} (status {attempt.status})",
                               "read the function's log group and the endpoint's; a 403 means the caller lacks "
                               "lambda:InvokeFunctionUrl"))
    if checks:
        return checks
    if not first.output_tokens:
        checks.append(fail("invocation: streaming", "no tokens came back", "read the function's log group"))
    else:
        checks.append(ok("invocation: streaming", f"{first.output_tokens} tokens streamed"))
    if second.cached_tokens is None:
        checks.append(fail("invocation: cached tokens", "the final usage has no cached_tokens",
                           "start the container with prompt-token details (vLLM: SM_VLLM_ENABLE_PROMPT_TOKENS_DETAILS)"))
    elif second.cached_tokens > 0:
        checks.append(ok("invocation: cached tokens", f"second request: {second.cached_tokens} of "
                         f"{second.prompt_tokens} prompt tokens cached (prefix caching works end to end)"))
    else:
        checks.append(fail("invocation: cached tokens", "the second, identical request had 0 cached tokens",
                           "check SM_VLLM_ENABLE_PREFIX_CACHING, and that both requests reached one copy "
                           "(routing strategy PREFIX_AWARE, PrefixAwareId)"))
    checks.append(_check_log_line(logs, log_group, second.request_id, log_wait_s, sleep))
    return checks


def _check_log_line(logs: Any, log_group: str, request_id: str | None, wait_s: float,
                    sleep: Callable[[float], None]) -> Check:
    title = f"request log line in {log_group}"
    if not request_id:
        return unknown(title, "the answer carried no request id to look it up")
    pattern = f'{{ $.{LogField.MESSAGE} = "{REQUEST_LOG_MESSAGE}" && $.request_id = "{request_id}" }}'
    deadline = time.monotonic() + wait_s
    while True:
        try:
            events = logs.filter_log_events(logGroupName=log_group, filterPattern=pattern,
                                            startTime=int((time.time() - 900) * 1000))["events"]
        except Exception as error:  # noqa: BLE001
            return unknown(title, f"cannot read it ({error_code(error)})", "grant logs:FilterLogEvents on the log group")
        if events or time.monotonic() >= deadline:
            break
        sleep(5.0)
    if not events:
        return unknown(title, f"no line for request {request_id} yet", "logs arrive within a minute: run verify again")
    line = json.loads(events[-1]["message"])
    missing = [f for f in QUERIED_FIELDS if f not in line]
    if missing:
        return fail(title, f"lacks {', '.join(missing)}", "the function runs another front door version: redeploy it")
    return ok(title, f"request {request_id} with {', '.join(QUERIED_FIELDS)}")
