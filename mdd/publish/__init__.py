"""Everything that reads a finished run and writes for people: report, dataset card, exports, comparisons."""
