//! Importers: resilience4j, Envoy, Istio, Sentinel and Hystrix settings turned into a Levee
//! [manifest](crate::manifest) and a [`Report`].
//!
//! Each source has one module that reads the file's settings and maps them to Levee's
//! policy (timeouts, retries, circuit breakers, bulkheads, outlier detection, kill
//! switches). Every setting of the file appears in the report, mapped (to which Levee
//! field, with which value) or not mapped (why); values are converted to Levee's units
//! (durations, ratios 0..1, percentages), and a value Levee does not allow is reported with
//! the allowed range instead of being clamped. The manifest always passes the agent's
//! `validate()`. What maps to what is documented in `docs/importers.md`.

mod common;
mod doc;
mod envoy;
mod hystrix;
mod istio;
mod plan;
mod report;
mod resilience4j;
mod sentinel;
mod spring;
mod units;

use std::path::PathBuf;

use levee_agent::policy::ValidationErrors;
use serde::Serialize;

pub use report::{Outcome, Report, Setting, Warning};
pub use units::{go_duration, levee_name, spring_duration};

use crate::manifest::{self, ServiceManifest};

/// A source format `levee import` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// resilience4j Spring Boot configuration (`application.yml` or `.properties`).
    Resilience4j,
    /// Envoy v3 configuration: a bootstrap, xDS resources, or resources inside a wrapper
    /// such as Cilium's `CiliumEnvoyConfig`.
    Envoy,
    /// Istio `VirtualService` and `DestinationRule` resources (one or more documents).
    Istio,
    /// Sentinel rules as JSON: flow, degrade or system rules.
    Sentinel,
    /// Hystrix (and Ribbon) settings from Spring / Archaius YAML or `.properties`.
    Hystrix,
}

impl Source {
    /// Attempts in total the source makes for a dependency whose file sets no retry for
    /// it, and why: what an import sets there instead of Levee's default.
    pub const fn attempts_without_retry(self) -> (u32, &'static str) {
        match self {
            Source::Resilience4j => (1, "no resilience4j retry instance for this name: one attempt"),
            Source::Envoy => (1, "no retry_policy: Envoy does not retry"),
            Source::Istio => (3, "no retries on the route: Istio retries twice by default (attempts: 2)"),
            Source::Sentinel => (1, "Sentinel does not retry"),
            Source::Hystrix => (1, "Hystrix does not retry, and no Ribbon retry setting is given"),
        }
    }

    /// The name on the command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Source::Resilience4j => "resilience4j",
            Source::Envoy => "envoy",
            Source::Istio => "istio",
            Source::Sentinel => "sentinel",
            Source::Hystrix => "hystrix",
        }
    }
}

/// Where the imported policy goes.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Environment of the manifest.
    pub environment: String,
    /// Service of the manifest; `None` = taken from the file (`spring.application.name`)
    /// or else from the file's name.
    pub service: Option<String>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        Self { environment: "default".into(), service: None }
    }
}

/// The result of an import.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The service, ready for `levee apply`; it passes `validate()`.
    pub manifest: ServiceManifest,
    /// Every setting of the file, mapped or not.
    pub report: Report,
}

/// Why a file could not be imported at all.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file is not well-formed in the format the source uses.
    #[error("not valid {format}: {message}")]
    Syntax {
        /// `YAML`, `JSON` or `.properties`.
        format: &'static str,
        /// The parser's message, with the line when it knows it.
        message: String,
    },
    /// The file parses but is not of the source's shape (e.g. not a list of rules).
    #[error("{0}")]
    Shape(String),
    /// A bad `--environment` or `--service`.
    #[error("{0}")]
    Option(String),
    /// The importer produced a policy `validate()` refuses and could not tell which
    /// setting caused it (a defect of the importer; please report it).
    #[error("the imported policy does not validate: {0}")]
    Invalid(ValidationErrors),
}

/// Imports `text` (the content of `file`) from `source`.
///
/// # Errors
/// [`ImportError`] when the file cannot be read as the source's format, or an option is
/// bad. Settings Levee cannot express are not errors: they are in the report.
pub fn import(
    source: Source,
    file: &str,
    text: &str,
    options: &ImportOptions,
) -> Result<Imported, ImportError> {
    let mut base =
        ServiceManifest::new(options.environment.clone(), options.service.clone().unwrap_or_default());
    base.description = format!("Imported by levee import --from {} {}", source.as_str(), file_name(file));
    let (mut manifest, mut report) = match source {
        Source::Resilience4j => resilience4j::import(file, text, base)?,
        Source::Envoy => envoy::import(file, text, base)?,
        Source::Istio => istio::import(file, text, base)?,
        Source::Sentinel => sentinel::import(file, text, base)?,
        Source::Hystrix => hystrix::import(file, text, base)?,
    };
    if manifest.service.is_empty() {
        let stem = std::path::Path::new(file).file_stem().and_then(|s| s.to_str()).unwrap_or("service");
        manifest.service = levee_name(stem);
    }
    if let Err(errors) = manifest.validate() {
        let names: Vec<_> =
            errors.0.iter().filter(|e| e.path == "environment" || e.path == "service").cloned().collect();
        if !names.is_empty() {
            return Err(ImportError::Option(ValidationErrors(names).to_string()));
        }
        return Err(ImportError::Invalid(errors));
    }
    report.warnings = report::warnings(&manifest.policy);
    Ok(Imported { manifest, report })
}

fn file_name(file: &str) -> &str {
    std::path::Path::new(file).file_name().and_then(|s| s.to_str()).unwrap_or(file)
}

/// Format of the report on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// Lines for people.
    #[default]
    Text,
    /// One JSON document (for CI jobs).
    Json,
}

/// Format of the manifest on stdout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// YAML, as `levee apply -f` reads it.
    #[default]
    Yaml,
    /// JSON (the same shape).
    Json,
}

/// `levee import`: prints the manifest on stdout and the report on stderr.
#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// Format of FILE.
    #[arg(long = "from", value_enum)]
    pub source: Source,
    /// The file to import.
    pub file: PathBuf,
    /// Environment of the manifest.
    #[arg(long, default_value = "default")]
    pub environment: String,
    /// Service of the manifest (default: from the file, e.g. spring.application.name, else
    /// the file's name).
    #[arg(long)]
    pub service: Option<String>,
    /// Format of the manifest on stdout.
    #[arg(long, value_enum, default_value_t)]
    pub output: OutputFormat,
    /// Format of the report on stderr.
    #[arg(long, value_enum, default_value_t)]
    pub report: ReportFormat,
}

/// Runs `levee import`.
///
/// # Errors
/// The file cannot be read or imported; the message names the file.
pub fn run_cli(args: &ImportArgs) -> anyhow::Result<()> {
    let name = args.file.display().to_string();
    let text = std::fs::read_to_string(&args.file).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let options = ImportOptions { environment: args.environment.clone(), service: args.service.clone() };
    let imported = import(args.source, &name, &text, &options).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let out = match args.output {
        OutputFormat::Yaml => manifest::to_yaml(std::slice::from_ref(&imported.manifest)),
        OutputFormat::Json => manifest::to_json(std::slice::from_ref(&imported.manifest)),
    };
    let report = match args.report {
        ReportFormat::Text => imported.report.render(),
        ReportFormat::Json => serde_json::to_string_pretty(&imported.report)? + "\n",
    };
    eprint!("{report}");
    if imported.report.mapped() == 0 && !imported.report.settings.is_empty() {
        // Legitimate (a file of only Sentinel flow rules maps nothing), but also what a
        // file of another format read with the wrong --from looks like.
        eprintln!(
            "warning: no setting of {name} was mapped; if it is not a {} file, --from names its format \
             (resilience4j, envoy, istio, sentinel, hystrix)",
            args.source.as_str()
        );
    }
    print!("{out}");
    Ok(())
}
