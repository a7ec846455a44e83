package testenv

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/jmoiron/sqlx"
)

// SmallFileSystem mounts a tmpfs of size at a directory of the test's own and unmounts it at
// cleanup: a disk that fills. It needs root, which the suite's machines and CI run as.
func SmallFileSystem(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("mounting a small file system needs root: run the tests as root, as `make test` and CI do")
	}
	dir, err := os.MkdirTemp("", "tgfull")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0777"); err != nil {
		os.Remove(dir)
		t.Fatalf("mount a %s tmpfs at %s: %v", size, dir, err)
	}
	t.Cleanup(func() {
		// Lazily: the database's cleanup (registered after, so run before) drops the table
		// first; a file the server still holds open must not fail the test.
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return dir
}

// TableOn creates db's table again, empty, with its data in dir (DATA DIRECTORY): a table on
// a file system of the test's own, such as SmallFileSystem's.
func TableOn(t testing.TB, db *sqlx.DB, table, dir string) {
	t.Helper()
	var name, create string
	if err := db.QueryRow("SHOW CREATE TABLE "+table).Scan(&name, &create); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("DROP TABLE " + table); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(create + " DATA DIRECTORY='" + dir + "'"); err != nil {
		t.Fatalf("%s on %s: %v", table, dir, err)
	}
}

// Fill writes path until its file system has no room left.
func Fill(t testing.TB, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "no space") {
				return
			}
			t.Fatal(err)
		}
	}
}
