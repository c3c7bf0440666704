"""One module per `genlab` sub-command. A module here is the whole command: `ORDER` (its place in
`genlab --help`), `add_parser(sub)` (its parser, built without torch) and the function it runs.
genlab.cli finds the modules by listing this package, so a new command is one new file."""
