# The wasm artifacts' sizes (mk/artifacts.tsv: each one's cargo profile, wasm-opt
# flags and budget).

.PHONY: sizes

## sizes: build every artifact of mk/artifacts.tsv (each build fails over its budget)
## and write docs/sizes.md, the size table the READMEs link to (bench/sizes.sh --write).
sizes: js-build component-build workers-build
	scripts/build-workers-js.sh
	bench/sizes.sh --write
