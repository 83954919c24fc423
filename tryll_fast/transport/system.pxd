# The Linux system calls the reactor uses: epoll, eventfd, sockets, vectored writes.
# Declared here once so _reactor.pyx reads like the design, not like a header dump.

from libc.stdint cimport uint32_t, uint64_t


cdef extern from "<errno.h>" nogil:
    int errno
    enum:
        EAGAIN
        EWOULDBLOCK
        EINTR
        EMFILE
        ENFILE
        ENOBUFS
        ENOMEM
        ECONNABORTED
        EPIPE
        ECONNRESET


cdef extern from "<string.h>" nogil:
    char* strerror(int errnum)


cdef extern from "<unistd.h>" nogil:
    ctypedef long ssize_t
    int close(int fd)
    ssize_t read(int fd, void* buf, size_t count)
    ssize_t write(int fd, const void* buf, size_t count)


cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    pthread_t pthread_self()
    int pthread_equal(pthread_t a, pthread_t b)


cdef extern from "<sys/epoll.h>" nogil:
    ctypedef union epoll_data_t:
        void* ptr
        int fd
        uint32_t u32
        uint64_t u64

    # packed on x86-64 in the C header; Cython uses the header's layout
    struct epoll_event:
        uint32_t events
        epoll_data_t data

    enum:
        EPOLLIN
        EPOLLOUT
        EPOLLERR
        EPOLLHUP
        EPOLLRDHUP
        EPOLL_CTL_ADD
        EPOLL_CTL_MOD
        EPOLL_CTL_DEL
        EPOLL_CLOEXEC

    int epoll_create1(int flags)
    int epoll_ctl(int epfd, int op, int fd, epoll_event* event)
    int epoll_wait(int epfd, epoll_event* events, int maxevents, int timeout)


cdef extern from "<sys/eventfd.h>" nogil:
    enum:
        EFD_NONBLOCK
        EFD_CLOEXEC
    int eventfd(unsigned int initval, int flags)


cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void* iov_base
        size_t iov_len


cdef extern from "<sys/socket.h>" nogil:
    ctypedef unsigned int socklen_t
    struct sockaddr:
        pass
    struct msghdr:
        void* msg_name
        socklen_t msg_namelen
        iovec* msg_iov
        size_t msg_iovlen
        void* msg_control
        size_t msg_controllen
        int msg_flags

    enum:
        SOCK_NONBLOCK
        SOCK_CLOEXEC
        MSG_DONTWAIT
        MSG_NOSIGNAL
        SHUT_WR
        SOL_SOCKET
        SO_SNDBUF

    int accept4(int sockfd, sockaddr* addr, socklen_t* addrlen, int flags)
    ssize_t recv(int sockfd, void* buf, size_t len, int flags)
    ssize_t send(int sockfd, const void* buf, size_t len, int flags)
    ssize_t sendmsg(int sockfd, const msghdr* msg, int flags)
    int shutdown(int sockfd, int how)
    int setsockopt(int sockfd, int level, int optname, const void* optval, socklen_t optlen)


cdef extern from "<netinet/in.h>" nogil:
    enum:
        IPPROTO_TCP


cdef extern from "<netinet/tcp.h>" nogil:
    enum:
        TCP_NODELAY


cdef extern from "<limits.h>" nogil:
    enum:
        IOV_MAX
