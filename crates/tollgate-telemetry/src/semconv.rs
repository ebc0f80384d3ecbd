//! The attribute names spans carry (SPEC OBS-5): the OpenTelemetry GenAI
//! semantic conventions **v1.37.0** (the first with `gen_ai.provider.name`,
//! which replaced `gen_ai.system`), pinned here as our own constants so an
//! upgrade is one reviewed change, plus tollgate's own under `tollgate.`.
//!
//! Never recorded: prompts, completions, message or tool contents
//! (`gen_ai.input.messages`, `gen_ai.output.messages`,
//! `gen_ai.system_instructions` are deliberately absent), keys, header
//! values.

/// The pinned semantic-conventions version (also the tracer's schema URL).
pub const VERSION: &str = "1.37.0";
/// Its schema URL.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.37.0";

/// `chat`, `embeddings`, ...
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
/// The model the request names.
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
/// The model that answered.
pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
/// Input tokens the provider reported.
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// Output tokens the provider reported.
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// `openai`, `azure.ai.openai`, `anthropic`, or the configured provider
/// name of an OpenAI-compatible server.
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
/// The class of error that ended the operation.
pub const ERROR_TYPE: &str = "error.type";
/// The upstream's host.
pub const SERVER_ADDRESS: &str = "server.address";
/// The upstream's port.
pub const SERVER_PORT: &str = "server.port";
/// The HTTP status sent (call) or received (attempt).
pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";

/// `gen_ai.operation.name` of chat-like routes (chat completions,
/// Responses, Messages).
pub const OP_CHAT: &str = "chat";
/// `gen_ai.operation.name` of embeddings.
pub const OP_EMBEDDINGS: &str = "embeddings";

/// The tenant's configured name.
pub const TOLLGATE_TENANT: &str = "tollgate.tenant";
/// The priority class the call was admitted in.
pub const TOLLGATE_CLASS: &str = "tollgate.class";
/// The route (`chat`, `embeddings`, `responses`, `messages`; a batch
/// item's `chat` or `embeddings`).
pub const TOLLGATE_ROUTE: &str = "tollgate.route";
/// The request id.
pub const TOLLGATE_REQUEST_ID: &str = "tollgate.request_id";
/// A batch item's `custom_id` (the batch runner's call spans).
pub const TOLLGATE_CUSTOM_ID: &str = "tollgate.custom_id";
/// The configured deployment.
pub const TOLLGATE_DEPLOYMENT: &str = "tollgate.deployment";
/// Whether the response was a stream.
pub const TOLLGATE_STREAM: &str = "tollgate.stream";
/// Upstream quota wait of the admitted attempt, milliseconds (SPEC OBS-4).
pub const TOLLGATE_QUOTA_WAIT_MS: &str = "tollgate.quota_wait_ms";
/// Concurrency wait of the admitted attempt, milliseconds (SPEC OBS-4).
pub const TOLLGATE_CONCURRENCY_WAIT_MS: &str = "tollgate.concurrency_wait_ms";
/// All admission waiting of the call (tenant and upstream), milliseconds.
pub const TOLLGATE_QUEUE_MS: &str = "tollgate.queue_ms";
/// Which limits bound the wait (`none` when it did not wait).
pub const TOLLGATE_LIMITED_BY: &str = "tollgate.limited_by";
/// Attempts that reached an upstream (call), or this attempt's number
/// across the call's deployments and fallbacks, from 1 (attempt).
pub const TOLLGATE_ATTEMPT: &str = "tollgate.attempt";
/// Why the previous attempt failed, on a retry (`rate_limited`,
/// `server_error`, `timeout`, ...).
pub const TOLLGATE_RETRY_CAUSE: &str = "tollgate.retry_cause";
/// Time left to the call's deadline when the attempt began, milliseconds
/// (absent without a deadline).
pub const TOLLGATE_DEADLINE_LEFT_MS: &str = "tollgate.deadline_left_ms";
/// Tokens reserved for the call (input plus output allowance).
pub const TOLLGATE_TOKENS_ESTIMATED: &str = "tollgate.tokens_estimated";
/// What the call cost its tenant, in dollars (SPEC BUD-6).
pub const TOLLGATE_COST_USD: &str = "tollgate.cost_usd";
