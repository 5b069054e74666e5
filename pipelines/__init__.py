"""Jobs a person runs: data preparation and other pipelines built on the seqdiff library."""
