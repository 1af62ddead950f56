//! The OpenAPI 3 document, generated from the route book that also builds the router.

use schemars::generate::SchemaSettings;
use schemars::{json_schema, SchemaGenerator};
use serde_json::{json, Map, Value};
use squadron_api::ErrorBody;
use squadron_core::access::TOKEN_ID_HEX_LEN;
use squadron_core::ids::NAME_PATTERN;
use squadron_core::limits::NAME_BYTES_MAX;

use crate::rest::{Answer, RouteDoc};

/// `/api/v1/tasks/:id` → (`/api/v1/tasks/{id}`, `["id"]`); a wildcard `*name` becomes
/// `{name}` too (it may contain slashes).
fn openapi_path(path: &str) -> (String, Vec<String>) {
    let mut params = Vec::new();
    let converted = path
        .split('/')
        .map(
            |seg| match seg.strip_prefix(':').or_else(|| seg.strip_prefix('*')) {
                Some(name) => {
                    params.push(name.to_string());
                    format!("{{{name}}}")
                }
                None => seg.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("/");
    (converted, params)
}

fn operation_id(method: &str, path: &str) -> String {
    let mut id = method.to_lowercase();
    for seg in path
        .split('/')
        .filter(|s| !s.is_empty() && *s != "api" && *s != "v1")
    {
        id.push('_');
        id.push_str(&seg.trim_start_matches([':', '*']).replace('-', "_"));
    }
    id
}

/// The schemas' home in the document; `$ref`s point there.
const SCHEMAS_PATH: &str = "/components/schemas";

/// JSON Schema 2020-12, which OpenAPI 3.1 uses as is, with definitions where OpenAPI keeps
/// them.
fn schema_generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = SCHEMAS_PATH.into();
            s.meta_schema = None;
        })
        .into_generator()
}

/// A path parameter's schema, by its name and the route it is in: numeric ids are positive
/// integers, names follow the name grammar, a token id is hex, the rest is text.
fn path_param_schema(path: &str, name: &str) -> Value {
    let name_schema =
        json!({"type": "string", "pattern": NAME_PATTERN, "maxLength": NAME_BYTES_MAX});
    match name {
        "tenant" | "project" | "server" => name_schema,
        "id" if path.starts_with("/api/v1/tokens/") => {
            json!({"type": "string", "pattern": format!("^[0-9a-f]{{{TOKEN_ID_HEX_LEN}}}$")})
        }
        "id" if path.starts_with("/api/v1/workers/")
            || path.starts_with("/api/v1/credentials/") =>
        {
            name_schema
        }
        "id" => json!({"type": "integer", "format": "uint64", "minimum": 1}),
        _ => json!({"type": "string"}),
    }
}

/// The operation's parameters: its path's, then one per property of its query type.
fn parameters(r: &RouteDoc, path_params: &[String], generator: &mut SchemaGenerator) -> Value {
    let mut out: Vec<Value> = path_params
        .iter()
        .map(|p| json!({"name": p, "in": "path", "required": true, "schema": path_param_schema(r.path, p)}))
        .collect();
    if let Some(query) = r.input.query {
        let schema = query(generator).to_value();
        let required = schema["required"].as_array().cloned().unwrap_or_default();
        if let Some(properties) = schema["properties"].as_object() {
            for (name, property) in properties {
                out.push(json!({
                    "name": name,
                    "in": "query",
                    "required": required.contains(&Value::String(name.clone())),
                    "schema": property,
                }));
            }
        }
    }
    Value::Array(out)
}

/// The success entry of an operation's responses: its status and its content.
fn answer(a: &Answer, generator: &mut SchemaGenerator) -> (&'static str, Value) {
    if a.upgrade {
        let upgrade = json!({"description": "switching to a WebSocket (subprotocol squadron.v1); \
            the messages are JSON"});
        return ("101", upgrade);
    }
    let schema = match a.schema {
        Some(schema) => schema(generator),
        None => json_schema!({"type": "string"}),
    };
    let content = json!({"description": "success", "content": {a.media_type: {"schema": schema}}});
    (a.status, content)
}

pub fn document(routes: &[RouteDoc]) -> Value {
    let mut generator = schema_generator();
    let error = generator.subschema_for::<ErrorBody>();
    let mut paths = Map::new();
    for r in routes {
        let (path, params) = openapi_path(r.path);
        let mut op = json!({
            "operationId": operation_id(r.method, r.path),
            "summary": r.summary,
            "x-squadron-access": r.access,
            "parameters": parameters(r, &params, &mut generator),
            "responses": {
                "default": {"description": "error", "content": {"application/json": {"schema": error}}}
            }
        });
        let (status, success) = answer(&r.answer, &mut generator);
        op["responses"][status] = success;
        if let Some(body) = r.input.body {
            let schema = body(&mut generator);
            let mut content = json!({"application/json": {"schema": schema}});
            if r.input.yaml {
                content["application/yaml"] = json!({"schema": schema});
            }
            op["requestBody"] = json!({"required": !r.input.optional, "content": content});
        }
        let entry = paths
            .entry(path)
            .or_insert_with(|| Value::Object(Map::new()));
        entry[r.method.to_lowercase()] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Squadron API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Control plane for AI coding agents. Writes may go to any node; reads are linearizable unless ?consistency=stale. Errors are {code, message}; see the ErrorBody schema."
        },
        "paths": paths,
        "components": {"schemas": generator.take_definitions(true)}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_params_convert() {
        assert_eq!(
            openapi_path("/api/v1/profiles/:id/mcp/:server"),
            (
                "/api/v1/profiles/{id}/mcp/{server}".to_string(),
                vec!["id".to_string(), "server".to_string()]
            )
        );
        assert_eq!(operation_id("GET", "/api/v1/tasks/:id"), "get_tasks_id");
    }
}
