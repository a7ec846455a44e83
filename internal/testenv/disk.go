package testenv

import (
	"context"
	"database/sql/driver"
	"errors"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"
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

// HoldPurge keeps InnoDB's purge off every change committed from now on, server-wide, until
// release is called or the test ends: it holds a read view open (a consistent snapshot), and
// purge never removes what a read view may still see. A test that fills a table's file system
// needs it from before the table's first change until room is given back. The entries a change
// leaves behind (an index key moved, a row settled) are removed by purge at a moment of its
// own, and removing them may free a page, for which InnoDB first reserves room: on the full
// disk MariaDB 10.11 tries that for about 5 s and then stops the server (an assertion in
// row0purge.cc), and every test of every package sharing it failed. How long the disk stays
// full is the machine's to say (a refusal the test waits for came 6 s after the first change
// on a loaded machine), so purge waits for room instead.
func HoldPurge(t testing.TB, db *sqlx.DB) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatalf("connection for the read view: %v", err)
	}
	// The gateway's idle_transaction_timeout (holds.Open) would end the snapshot midway.
	// MySQL has no such variable (1193, unknown): its sessions have no such bound either.
	var me *mysql.MySQLError
	if _, err := conn.ExecContext(ctx, "SET SESSION idle_transaction_timeout = 0"); err != nil && !(errors.As(err, &me) && me.Number == 1193) {
		conn.Close()
		t.Fatalf("read view session: %v", err)
	}
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
		conn.Close()
		t.Fatalf("read view: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, _ = conn.ExecContext(ctx, "ROLLBACK")
			// Not pooled with the session's settings changed.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			conn.Close()
		})
	}
	t.Cleanup(release)
	return release
}
