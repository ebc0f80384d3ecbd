//! Provider flavours and the routes models serve (SPEC WIRE-2, WIRE-4).
//!
//! A flavour says how a provider is reached (URL shape, where the key
//! goes) and which of the gateway's routes it can serve; a model serves
//! the routes every one of its deployments' providers can serve, or the
//! subset its `routes` lists. Nothing is translated between dialects: a
//! client speaks the dialect of the route it calls.

use http::{HeaderName, HeaderValue};
use tollgate_openai::tokens::Profile;

use super::error::{FieldPath, Problem};

/// `providers.<name>.flavor`: how the provider is reached (SPEC WIRE-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flavor {
    /// OpenAI's API: `{base_url}/chat/completions`, `/embeddings`,
    /// `/responses`; `Authorization: Bearer <key>` (the default).
    #[default]
    OpenAi,
    /// Azure OpenAI: `{base_url}/openai/deployments/<upstream_model>/...`
    /// with `?api-version=<api_version>`, the key in `api-key`, never an
    /// `Authorization` header. A deployment's `upstream_model` is the Azure
    /// deployment name.
    Azure,
    /// Any server that speaks OpenAI's chat completions (vLLM, Ollama,
    /// Together, Groq, the OpenAI-compatible endpoints of Gemini and
    /// Anthropic): OpenAI's paths below `base_url`, the key in
    /// `auth_header` (default `Authorization`) after `auth_prefix` (default
    /// `Bearer `).
    OpenAiCompatible,
    /// Anthropic's Messages API: `{base_url}/messages`, the key in
    /// `x-api-key`, an `anthropic-version` header (default
    /// [`ANTHROPIC_VERSION`]).
    Anthropic,
}

/// The first Azure `api-version` (its date) that takes
/// `max_completion_tokens`.
const AZURE_MAX_COMPLETION_TOKENS: &str = "2024-09-01";

/// The `anthropic-version` sent to an `anthropic` provider unless its
/// `headers` (or the client, on `/v1/messages`) set another.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

impl Flavor {
    /// The provider's `gen_ai.provider.name` in traces (SPEC OBS-5): the
    /// conventions' name of a known provider, else `configured` (the
    /// provider's table name).
    pub fn gen_ai_provider_name(self, configured: &str) -> std::borrow::Cow<'_, str> {
        match self {
            Flavor::OpenAi => "openai".into(),
            Flavor::Azure => "azure.ai.openai".into(),
            Flavor::Anthropic => "anthropic".into(),
            Flavor::OpenAiCompatible => configured.into(),
        }
    }

    /// The configuration name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Flavor::OpenAi => "openai",
            Flavor::Azure => "azure",
            Flavor::OpenAiCompatible => "openai_compatible",
            Flavor::Anthropic => "anthropic",
        }
    }

    /// Parses a configuration name.
    pub fn parse(name: &str) -> Option<Flavor> {
        [
            Flavor::OpenAi,
            Flavor::Azure,
            Flavor::OpenAiCompatible,
            Flavor::Anthropic,
        ]
        .into_iter()
        .find(|f| f.as_str() == name)
    }

    /// How a provider of this flavour counts a request when its
    /// `accounting` is left out (SPEC Q-16): OpenAI and Azure OpenAI by
    /// OpenAI's documented rate-limit rule (characters / 4 and the output
    /// cap), Anthropic by its profile, an OpenAI-compatible server (whose
    /// limiter tollgate cannot know) by the model family's tokenizer.
    pub const fn default_accounting(self) -> Profile {
        match self {
            Flavor::OpenAi | Flavor::Azure => Profile::OpenAi,
            Flavor::OpenAiCompatible => Profile::Tokenizer,
            Flavor::Anthropic => Profile::Anthropic,
        }
    }

    /// Whether a provider of this flavour can serve `route` at all.
    ///
    /// Azure's Responses API lives under another path scheme
    /// (`/openai/v1/responses`) than its deployments, so it is not offered
    /// through the `azure` flavour; an `openai_compatible` provider pointed
    /// at `https://<resource>.openai.azure.com/openai/v1` can serve it.
    pub const fn serves(self, route: ApiRoute) -> bool {
        match self {
            Flavor::OpenAi | Flavor::OpenAiCompatible => !matches!(route, ApiRoute::Messages),
            Flavor::Azure => matches!(route, ApiRoute::Chat | ApiRoute::Embeddings),
            Flavor::Anthropic => matches!(route, ApiRoute::Messages),
        }
    }

    /// The routes a generative (`kind = "chat"`) model of this flavour
    /// serves when it does not list `routes`: what the provider surely
    /// offers. OpenAI serves chat completions and Responses; an
    /// OpenAI-compatible server surely only chat completions.
    pub const fn default_routes(self) -> &'static [ApiRoute] {
        match self {
            Flavor::OpenAi => &[ApiRoute::Chat, ApiRoute::Responses],
            Flavor::Azure | Flavor::OpenAiCompatible => &[ApiRoute::Chat],
            Flavor::Anthropic => &[ApiRoute::Messages],
        }
    }
}

/// A gateway route a model may serve (SPEC WIRE-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiRoute {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/messages` (Anthropic's dialect).
    Messages,
}

impl ApiRoute {
    /// Every route.
    pub const ALL: [ApiRoute; 4] = [
        ApiRoute::Chat,
        ApiRoute::Embeddings,
        ApiRoute::Responses,
        ApiRoute::Messages,
    ];

    /// The configuration name (`routes = ["chat", "responses"]`).
    pub const fn as_str(self) -> &'static str {
        match self {
            ApiRoute::Chat => "chat",
            ApiRoute::Embeddings => "embeddings",
            ApiRoute::Responses => "responses",
            ApiRoute::Messages => "messages",
        }
    }

    /// The path clients call.
    pub const fn path(self) -> &'static str {
        match self {
            ApiRoute::Chat => "/v1/chat/completions",
            ApiRoute::Embeddings => "/v1/embeddings",
            ApiRoute::Responses => "/v1/responses",
            ApiRoute::Messages => "/v1/messages",
        }
    }

    /// Parses a configuration name.
    pub fn parse(name: &str) -> Option<ApiRoute> {
        ApiRoute::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

/// The names `routes` accepts, for messages.
pub(super) fn route_names() -> String {
    ApiRoute::ALL
        .iter()
        .map(|r| format!("{:?}", r.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How a provider is addressed: flavour, Azure's API version, where the key
/// goes, and static headers and query parameters (SPEC WIRE-2).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProviderWire {
    /// `flavor` (default `openai`).
    pub flavor: Flavor,
    /// `api_version`: Azure's `api-version` query value (required for
    /// `azure`, refused elsewhere: put it in `query`).
    pub api_version: Option<String>,
    /// `auth_header`: the header carrying the key (`openai_compatible`
    /// only; default `Authorization`).
    pub auth_header: Option<String>,
    /// `auth_prefix`: written before the key in that header
    /// (`openai_compatible` only; default `Bearer ` for `Authorization`,
    /// empty for any other header).
    pub auth_prefix: Option<String>,
    /// `headers`: static headers sent with every request, sorted by name.
    /// Not secrets: a key belongs in `api_key_env`.
    pub headers: Vec<(String, String)>,
    /// `query`: static query parameters added to every URL, sorted by name.
    pub query: Vec<(String, String)>,
}

impl ProviderWire {
    /// Where the key goes: the header name and the prefix before the key.
    pub fn key_header(&self) -> (HeaderName, String) {
        match self.flavor {
            Flavor::OpenAi => (http::header::AUTHORIZATION, "Bearer ".to_owned()),
            Flavor::Azure => (HeaderName::from_static("api-key"), String::new()),
            Flavor::Anthropic => (HeaderName::from_static("x-api-key"), String::new()),
            Flavor::OpenAiCompatible => {
                let name = self
                    .auth_header
                    .as_deref()
                    .and_then(|h| HeaderName::from_bytes(h.trim().as_bytes()).ok())
                    .unwrap_or(http::header::AUTHORIZATION);
                let prefix = match &self.auth_prefix {
                    Some(p) => p.clone(),
                    None if name == http::header::AUTHORIZATION => "Bearer ".to_owned(),
                    None => String::new(),
                };
                (name, prefix)
            }
        }
    }

    /// The static headers, validated, with the flavour's own defaults
    /// (`anthropic-version` for `anthropic`) where `headers` does not set
    /// them.
    pub fn header_map(&self) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        if self.flavor == Flavor::Anthropic {
            map.insert(
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static(ANTHROPIC_VERSION),
            );
        }
        for (name, value) in &self.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                map.insert(n, v);
            }
        }
        map
    }

    /// Where a chat completion's output cap goes when the gateway sets one
    /// (a request without a cap is sent with its reserved allowance):
    /// `max_completion_tokens` for OpenAI, whose reasoning models take no
    /// other, and for Azure from the `api-version` that introduced it
    /// (2024-09-01-preview; earlier ones refuse it); `max_tokens` for
    /// older Azure versions and every other server.
    pub fn cap_field(&self) -> tollgate_openai::wire::CapField {
        use tollgate_openai::wire::CapField;
        match self.flavor {
            Flavor::OpenAi => CapField::MaxCompletionTokens,
            Flavor::Azure => match &self.api_version {
                Some(v)
                    if v.get(..10)
                        .is_some_and(|date| date >= AZURE_MAX_COMPLETION_TOKENS) =>
                {
                    CapField::MaxCompletionTokens
                }
                _ => CapField::MaxTokens,
            },
            Flavor::OpenAiCompatible | Flavor::Anthropic => CapField::MaxTokens,
        }
    }

    /// The base URL of one deployment: for `azure` the deployment's path
    /// and `api-version`; then the static query parameters.
    pub fn base_url(&self, base_url: &str, upstream_model: &str) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        let mut url = base_url.to_owned();
        if self.flavor == Flavor::Azure {
            url = format!("{url}/openai/deployments/{upstream_model}");
            if let Some(version) = &self.api_version {
                query.append_pair("api-version", version);
            }
        }
        for (name, value) in &self.query {
            query.append_pair(name, value);
        }
        let query = query.finish();
        if query.is_empty() {
            url
        } else {
            format!("{url}?{query}")
        }
    }

    /// Checks the settings of the provider table at `at`.
    pub(super) fn check(&self, at: &FieldPath) -> Result<(), Problem> {
        let flavor = self.flavor.as_str();
        match (self.flavor, &self.api_version) {
            (Flavor::Azure, None) => {
                return Err(Problem::invalid(
                    &at.key("api_version"),
                    "an azure provider needs api_version (Azure's api-version, e.g. \
                     \"2024-10-21\")",
                ));
            }
            (Flavor::Azure, Some(v)) if v.trim().is_empty() => {
                return Err(Problem::invalid(
                    &at.key("api_version"),
                    "must not be empty",
                ));
            }
            (Flavor::Azure, Some(_)) | (_, None) => {}
            (_, Some(_)) => {
                return Err(Problem::invalid(
                    &at.key("api_version"),
                    format!(
                        "applies only to flavor = \"azure\" (this provider is {flavor:?}); \
                         put other query parameters in query"
                    ),
                ));
            }
        }
        if self.flavor != Flavor::OpenAiCompatible {
            for (field, set) in [
                ("auth_header", self.auth_header.is_some()),
                ("auth_prefix", self.auth_prefix.is_some()),
            ] {
                if set {
                    return Err(Problem::invalid(
                        &at.key(field),
                        format!(
                            "applies only to flavor = \"openai_compatible\"; a {flavor:?} \
                             provider sends its key where its API expects it"
                        ),
                    ));
                }
            }
        }
        if let Some(header) = &self.auth_header {
            let Ok(name) = HeaderName::from_bytes(header.trim().as_bytes()) else {
                return Err(Problem::invalid(
                    &at.key("auth_header"),
                    format!("{header:?} is not a valid HTTP header name"),
                ));
            };
            if name != http::header::AUTHORIZATION && GATEWAY_HEADERS.contains(&name.as_str()) {
                return Err(Problem::invalid(
                    &at.key("auth_header"),
                    format!(
                        "{header:?} is set by the gateway itself; name the header the key goes in"
                    ),
                ));
            }
        }
        if let Some(prefix) = &self.auth_prefix
            && HeaderValue::from_str(prefix).is_err()
        {
            return Err(Problem::invalid(
                &at.key("auth_prefix"),
                "must be printable ASCII (it is sent in a header)",
            ));
        }
        for (name, value) in &self.headers {
            let path = at.key("headers").key(name);
            let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
                return Err(Problem::invalid(
                    &path,
                    format!("{name:?} is not a valid HTTP header name"),
                ));
            };
            if HeaderValue::from_str(value).is_err() {
                return Err(Problem::invalid(&path, "the value must be printable ASCII"));
            }
            if GATEWAY_HEADERS.contains(&header.as_str()) {
                return Err(Problem::invalid(
                    &path,
                    format!(
                        "{name:?} is set by the gateway (keys come from api_key_env, never \
                         from the file)"
                    ),
                ));
            }
        }
        for (name, _) in &self.query {
            if name.trim().is_empty() {
                return Err(Problem::invalid(
                    &at.key("query"),
                    "a query parameter needs a name",
                ));
            }
            if self.flavor == Flavor::Azure && name == "api-version" {
                return Err(Problem::invalid(
                    &at.key("query").key(name),
                    "set api_version instead",
                ));
            }
        }
        Ok(())
    }
}

/// Headers the gateway sets (keys, framing, the request id): neither `headers` nor `auth_header` may name them.
const GATEWAY_HEADERS: [&str; 13] = [
    "authorization",
    "api-key",
    "x-api-key",
    "content-type",
    "content-length",
    "host",
    "accept",
    "x-request-id",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "expect",
];

/// Whether `name` can be an Azure deployment name in a URL path: letters,
/// digits, `-`, `_`, `.` (what Azure allows), and not `.` or `..`.
pub(super) fn is_azure_deployment(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl super::GatewayConfig {
    /// The routes model `m` serves (SPEC WIRE-4): its `routes` as listed,
    /// else `embeddings` for an embeddings model, else the routes every one
    /// of its deployments' flavours serves by default (in [`ApiRoute::ALL`]
    /// order). Empty when its deployments share no route (a configuration
    /// error reported by validation).
    pub fn model_routes(&self, m: &super::ModelConfig) -> Vec<ApiRoute> {
        if let Some(routes) = &m.routes {
            return routes.clone();
        }
        if m.kind == super::ModelKind::Embeddings {
            return vec![ApiRoute::Embeddings];
        }
        ApiRoute::ALL
            .into_iter()
            .filter(|r| {
                m.deployments.iter().all(|d| {
                    self.provider(&d.provider)
                        .is_some_and(|p| p.wire.flavor.default_routes().contains(r))
                })
            })
            .collect()
    }

    /// The routes of model `m` at `at`: listed ones are possible for its
    /// kind and served by every deployment's flavour; defaults exist.
    pub(super) fn check_routes(
        &self,
        at: &FieldPath,
        m: &super::ModelConfig,
    ) -> Result<(), Problem> {
        let embeddings = m.kind == super::ModelKind::Embeddings;
        if let Some(routes) = &m.routes {
            let path = at.key("routes");
            if routes.is_empty() {
                return Err(Problem::invalid(
                    &path,
                    format!("must list at least one route ({})", route_names()),
                ));
            }
            for (i, route) in routes.iter().enumerate() {
                if routes.get(..i).is_some_and(|before| before.contains(route)) {
                    return Err(Problem::invalid(
                        &path.index(i),
                        format!("{:?} is listed twice", route.as_str()),
                    ));
                }
                if embeddings != (*route == ApiRoute::Embeddings) {
                    return Err(Problem::invalid(
                        &path.index(i),
                        format!(
                            "a {} model cannot serve {:?}; embeddings models serve only \
                             \"embeddings\"",
                            m.kind.as_str(),
                            route.as_str()
                        ),
                    ));
                }
                for d in &m.deployments {
                    if let Some(p) = self.provider(&d.provider)
                        && !p.wire.flavor.serves(*route)
                    {
                        return Err(Problem::invalid(
                            &path.index(i),
                            format!(
                                "provider {:?} (flavor {:?}) does not serve {} ; nothing is \
                                 translated between dialects",
                                p.name,
                                p.wire.flavor.as_str(),
                                route.path()
                            ),
                        ));
                    }
                }
            }
            return Ok(());
        }
        if self.model_routes(m).is_empty() {
            return Err(Problem::invalid(
                &at.key("routes"),
                "its deployments' providers share no route (e.g. an anthropic and an openai \
                 provider); give each dialect its own model",
            ));
        }
        for d in &m.deployments {
            if let Some(p) = self.provider(&d.provider)
                && embeddings
                && !p.wire.flavor.serves(ApiRoute::Embeddings)
            {
                return Err(Problem::invalid(
                    &at.key("kind"),
                    format!(
                        "provider {:?} (flavor {:?}) does not serve /v1/embeddings",
                        p.name,
                        p.wire.flavor.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }
}
