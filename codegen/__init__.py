"""pgoutput-codegen: load the YAML spec, check it, and render every target from one model."""
