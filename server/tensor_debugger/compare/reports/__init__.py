"""Reports of computed pairs: pair and module reports, progress, heatmaps, slices, the inspector, exports, the
contract a compare hands the command line and the API."""
