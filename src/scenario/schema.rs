//! The scenario file's JSON Schema, generated from [`RawScenario`] (the
//! TOML as written): what an editor completes and checks a scenario with
//! (Taplo reads it). docs/schema/scenario.schema.json is this text; a test
//! keeps it so, and every scenario in the repository validates against it.
//!
//! It says what a file may hold: the keys, their types and defaults, the
//! names a choice takes, a probability's bounds. What only validation
//! knows (a count's limits, a duration's syntax, one key against
//! another) stays there.

use super::RawScenario;
use schemars::transform::RecursiveTransform;
use schemars::Schema;
use serde_json::Value;

/// The schema as pretty JSON, ending in a newline. Draft 7, which Taplo
/// and other editors read.
pub fn json_schema() -> String {
    let mut schema = schemars::generate::SchemaSettings::draft07()
        .with_transform(RecursiveTransform(no_null))
        .into_generator()
        .into_root_schema_for::<RawScenario>();
    schema.insert("title".into(), "chaos scenario".into());
    // RawScenario's own doc speaks to whoever changes the code.
    let about = "A chaos scenario: the run, the system under test and the faults to strike. Every key is optional; \
                 docs/scenarios.md says what each does, and `chaos init` writes every key at its default.";
    schema.insert("description".into(), about.into());
    serde_json::to_string_pretty(&schema).expect("a schema is JSON") + "\n"
}

/// TOML has no null: an optional key is one left out. Drops the `null`
/// that an `Option` adds to a key's types, and its `null` default.
fn no_null(schema: &mut Schema) {
    let Some(obj) = schema.as_object_mut() else { return };
    if obj.get("default").is_some_and(Value::is_null) {
        obj.remove("default");
    }
    if let Some(Value::Array(types)) = obj.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            obj.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(any)) = obj.get_mut("anyOf") {
        any.retain(|s| s != &serde_json::json!({ "type": "null" }));
        if any.len() == 1 {
            // A lone `$ref` keeps its description beside it, as schemars
            // writes a required one.
            let only = obj.remove("anyOf").unwrap_or_default();
            obj.insert("allOf".into(), only);
        }
    }
}
