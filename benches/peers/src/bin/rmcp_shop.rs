//! The official MCP SDK, rmcp, serving `create_order` and `list_products` over streamable HTTP:
//! stateless with JSON responses (its fastest configuration), or with `--sessions` the
//! `initialize`/`Mcp-Session-Id` generation (2025-11-25), as carmy's `/mcp` serves both.

use axum::serve::ListenerExt;
use carmy_bench_peers::{NewOrder, OrderError, Shop};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler, tool, tool_handler, tool_router};

#[derive(Clone)]
struct ShopServer {
    shop: Shop,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl ShopServer {
    #[tool(description = "Place an order")]
    async fn create_order(
        &self,
        Parameters(input): Parameters<NewOrder>,
    ) -> Result<Json<carmy_bench_peers::Placed>, ErrorData> {
        self.shop
            .create_order(input)
            .map(Json)
            .map_err(|error| match error {
                OrderError::UnknownSku => ErrorData::invalid_params("no such product", None),
                OrderError::OutOfStock => ErrorData::invalid_params("out of stock", None),
            })
    }

    #[tool(description = "List the products")]
    async fn list_products(&self) -> Result<Json<carmy_bench_peers::Products>, ErrorData> {
        Ok(Json(self.shop.list_products()))
    }
}

// The server's own router, as rmcp's examples keep it; the attribute's default,
// `Self::tool_router()`, would build it (and every tool's schemas) again on each call.
#[tool_handler(router = self.tool_router)]
impl ServerHandler for ShopServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() {
    let addr = std::env::var("CARMY_ADDR").unwrap_or_else(|_| "127.0.0.1:3007".to_owned());
    let shop = Shop::default();
    let sessions = std::env::args().any(|argument| argument == "--sessions");
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(sessions)
        .with_json_response(true)
        .with_sse_keep_alive(None);
    // Stateless, the SDK makes a server per request: each takes a copy of the one router.
    let tool_router = ShopServer::tool_router();
    let service: StreamableHttpService<ShopServer, LocalSessionManager> =
        StreamableHttpService::new(
            move || {
                Ok(ShopServer {
                    shop: shop.clone(),
                    tool_router: tool_router.clone(),
                })
            },
            Default::default(),
            config,
        );
    let router = axum::Router::new().nest_service("/mcp", service);
    // Without Nagle's delay, as carmy serves: a session's answer is an event stream written in
    // several chunks, each of which would otherwise wait for the client's delayed ACK (40 ms).
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind")
        .tap_io(|stream| {
            let _ = stream.set_nodelay(true);
        });
    axum::serve(listener, router).await.expect("serve");
}
