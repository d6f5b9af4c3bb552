"""The teaching kit, beside the core: the command line, the demo, the grader, the quiz, slides
and benchmarks. Nothing in the core imports from here."""
