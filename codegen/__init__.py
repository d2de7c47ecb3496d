"""codegen: load YAML specs, check them, and render every target from one model per spec."""
