package holds

// SetMaxReportRows lowers the usage report's row bound for a test and restores it after.
func SetMaxReportRows(n int) (restore func()) {
	old := maxReportRows
	maxReportRows = n
	return func() { maxReportRows = old }
}
