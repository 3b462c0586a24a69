//! The run report's JSON Schema, generated from [`Report`]: what a script
//! or a CI job reading `reports/<run-id>.json` may rely on.
//! docs/schema/report.schema.json is this text; a test keeps it so, and
//! every end-to-end run's report is validated against it.

use super::Report;

/// The schema as pretty JSON, ending in a newline. Draft 7, which editors
/// and validators read alike; of the JSON as written (`skip_serializing_if`
/// fields are optional, every other one required).
pub fn json_schema() -> String {
    let mut schema =
        schemars::generate::SchemaSettings::draft07().for_serialize().into_generator().into_root_schema_for::<Report>();
    schema.insert("title".into(), "chaos run report".into());
    serde_json::to_string_pretty(&schema).expect("a schema is JSON") + "\n"
}
