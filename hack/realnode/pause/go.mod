module nodewright.local/realnode/pause

go 1.26.0
